#!/bin/sh
# llama-server for the llamaforge deployment lab, as the container llamaforge-lab on this host's Docker
# engine, from the runtime image llamaforge/llama-server:0c746799120471183e5949a10bb9dc1e:
# sha256:eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee
# Rendered by llamaforge (the release id is a digest of this file). Run as root, right after the switch, from
# the release that /opt/llamaforge/lab/current points at: it replaces the container.
# The release and the model are mounted read-only; the network is the host's, so llama-server binds
# 127.0.0.1 of this host as it would without a container. No secret is in this file: an API key is the
# release's file, read with --api-key-file.
set -eu
release=$(readlink -f /opt/llamaforge/lab/current)
model=$(readlink -f "$release/model.gguf")
user="$(id -u llamaforge):$(id -g llamaforge)"
docker rm --force llamaforge-lab >/dev/null 2>&1 || true
exec docker run --detach --name llamaforge-lab \
  --label org.llamaforge.deployment=lab \
  --restart unless-stopped \
  --network host \
  --user "$user" \
  --read-only --cap-drop ALL --security-opt no-new-privileges \
  --log-opt max-size=10m --log-opt max-file=3 \
  --mount "type=bind,source=$release,target=/release,readonly" \
  --mount "type=bind,source=$model,target=/models/model.gguf,readonly" \
  --health-cmd 'curl -fsS http://127.0.0.1:8081/health >/dev/null || exit 1' \
  --health-interval 5s --health-timeout 5s \
  --health-retries 3 --health-start-period 30s \
  sha256:eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee \
  -m /models/model.gguf --host 127.0.0.1 --port 8081 --no-webui -c 512 -t 2
