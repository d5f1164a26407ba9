"""The core every stage shares: errors, progress events and cancellation, background jobs, the operation registry,
templates and data paths."""
