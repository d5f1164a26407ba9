"""Rich markup the CLI renderers of several operations share."""

# A check's status in colour, shared by the renderers of every operation that has checks.
STATUS = {"ok": "[green]ok[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[red]fail[/red]"}
