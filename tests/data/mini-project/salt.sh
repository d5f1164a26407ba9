#!/bin/sh
# Writes a header with 8 random bytes: a deliberately non-reproducible input.
printf 'static const char salt[] = "%s";\n' "$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')" > "$1"
