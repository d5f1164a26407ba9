#!/bin/bash
# A systemd + sshd deploy host on a machine without Docker (as root): the test host's file system booted with
# systemd as PID 1 in pid, mount, uts, ipc and cgroup namespaces of its own, sharing this machine's network, with
# sshd on 127.0.0.1:PORT only (keys only, the host keys made at its boot) and the user lf (passwordless sudo)
# holding one authorized key. It ran the real deploys on the AMX Xeon (docs/benchmarks.md#amx), whose CPU the
# host then shares.
#
#   scripts/nshost.sh up DIR ROOTFS.tar[.xz] PORT AUTHORIZED_KEY   unpack ROOTFS into DIR and boot it
#   scripts/nshost.sh down DIR                                     halt it, remove its cgroup (DIR stays)
#
# ROOTFS is the suite's systemd test host image exported where Docker runs (tests/testhosts.py):
#   docker export "$(docker create llamaforge-testhost:TAG)" | xz -T0 > hostfs.tar.xz
# Its known_hosts line afterwards: "[127.0.0.1]:PORT $(cut -d' ' -f1,2 DIR/etc/ssh/ssh_host_ed25519_key.pub)".
# A command inside it: nsenter -t "$(cat DIR.pid)" -m -p -u -i -r -w journalctl -u llamaforge-default
set -eu
[ $# -ge 2 ] || { sed -n 2,14p "$0"; exit 2; }
cmd=$1; R=$2
cgroot() { if [ -f /sys/fs/cgroup/cgroup.procs ] && [ "$(stat -f -c %T /sys/fs/cgroup)" = cgroup2fs ]; then echo /sys/fs/cgroup;
           elif [ -d /sys/fs/cgroup/unified ]; then echo /sys/fs/cgroup/unified;
           else mkdir -p /tmp/cg2 && { mountpoint -q /tmp/cg2 || mount -t cgroup2 cgroup2 /tmp/cg2; } && echo /tmp/cg2; fi; }
CG=$(cgroot)/nshost-$(basename "$R")
if [ "$cmd" = down ]; then
    pid=$(cat "$R.pid")
    kill -s SIGRTMIN+3 "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true; sleep 0.5
    find "$CG" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    exit 0
fi
TAR=$3; PORT=$4; KEY=$5
mkdir -p "$R"
tar -xf "$TAR" -C "$R"
printf 'Port %s\nListenAddress 127.0.0.1\n' "$PORT" > "$R/etc/ssh/sshd_config.d/port.conf"
install -m 600 -o 1000 -g 1000 "$KEY" "$R/home/lf/.ssh/authorized_keys"
echo "nshost" > "$R/etc/hostname"
printf '127.0.0.1 localhost nshost\n' > "$R/etc/hosts"
for unit in getty@.service serial-getty@.service console-getty.service getty.target; do
    ln -sf /dev/null "$R/etc/systemd/system/$unit"   # no login prompts on this machine's consoles
done
mkdir -p "$CG"
# shellcheck disable=SC2016  # $$ and $1 are the inner shell's
setsid sh -c 'echo $$ > "$1/cgroup.procs"; exec unshare --pid --fork --mount --uts --ipc --cgroup --propagation private sh -c "
  set -e; R=\$0
  mount --bind \$R \$R
  mount -t proc proc \$R/proc
  mount -t sysfs -o ro sysfs \$R/sys
  mount -t cgroup2 cgroup2 \$R/sys/fs/cgroup
  mount -t tmpfs -o mode=755 tmpfs \$R/run
  mount -t tmpfs -o mode=1777 tmpfs \$R/tmp
  mount -t tmpfs -o mode=755,nosuid tmpfs \$R/dev
  for d in null zero full random urandom tty; do touch \$R/dev/\$d; mount --bind /dev/\$d \$R/dev/\$d; done
  mkdir \$R/dev/pts \$R/dev/shm
  mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts \$R/dev/pts
  ln -s pts/ptmx \$R/dev/ptmx
  mount -t tmpfs -o mode=1777 tmpfs \$R/dev/shm
  hostname nshost
  exec chroot \$R /usr/bin/env -i container=llamaforge-nshost /lib/systemd/systemd
" "$2"' nshost "$CG" "$R" > "$R.log" 2>&1 < /dev/null &
sleep 1
# the init is unshare's child: the process named systemd in that cgroup tree
for _ in $(seq 1 60); do
    pid=$(find "$CG" -name cgroup.procs -exec cat {} + | while read -r p; do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = systemd ] && echo "$p"; done | sort -n | head -1)
    [ -n "$pid" ] && break; sleep 0.5
done
echo "$pid" > "$R.pid"
for _ in $(seq 1 120); do
    if timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$PORT && head -c 4 <&3" 2>/dev/null | grep -q SSH; then
        echo "up: pid $pid, sshd on 127.0.0.1:$PORT"; exit 0
    fi
    sleep 0.5
done
echo "nshost did not come up"; cat "$R.log"; exit 1
