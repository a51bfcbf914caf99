#!/bin/bash
# run.sh - boot a throw-away guest (a stock Debian kernel with an initramfs built
# from this machine's Debian packages) under QEMU and run one command inside it.
# Usage: bash .ci/vm/run.sh [options] (-c 'command' | script.sh [args...])
#        bash .ci/vm/run.sh --build-only
#
# Why a guest: the privileged primitives (device-mapper targets, the iSCSI
# initiator and targets) need kernel modules that a CI container's kernel may
# lack and cannot load. A stock Debian kernel has them all. Everything comes
# from Debian packages, so a fresh bookworm machine with apt runs this as root.
# The kernel package is only downloaded and unpacked, never installed.
#
# Options:
#   -c CMD       run CMD (sh) in the guest
#   -f PATH      copy PATH (file or folder) into the guest at /job/files/ (repeatable)
#   -j DIR       use DIR as the job folder (default: a new one under the cache)
#   -m MiB       guest memory (default 2048, at most 2048)
#   -p N         guest vCPUs (default: host cores, at most 2)
#   -t SEC       time limit for the whole guest run (default 1200)
#   --iscsid     start iscsid in the guest before the command
#   --udev       start systemd-udevd in the guest (off by default; costs ~1-2 s)
#   -v           show kernel messages on the console
#   --rebuild    rebuild the cached guest image
#   --build-only only (re)build the cached guest image
#
# In the guest: /job is the job folder (9p, read-write; results go there),
# configfs is mounted, DM_DISABLE_UDEV=1 is set unless --udev, and the
# command runs as root in its own session. Output streams to stdout; the exit
# code is the command's, or 125 when the guest never reported one.
# Env: WASMCSI_VM_CACHE (default /var/tmp/wasmcsi-vm) holds the kernel, the
# image and job folders; QEMU_EXTRA adds qemu arguments (word-split).
set -euo pipefail

IMAGE_REV=3   # bump when the image layout below changes
CACHE=${WASMCSI_VM_CACHE:-/var/tmp/wasmcsi-vm}
MEM=2048 SMP=$(nproc) TIMEOUT=1200 ISCSID=0 UDEV=0 VERBOSE=0 REBUILD=0 BUILD_ONLY=0
CMD="" SCRIPT="" JOB="" FILES=()
[ "$SMP" -gt 2 ] && SMP=2
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() { printf '[vm %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 125; }

while [ $# -gt 0 ]; do
  case "$1" in
    -c) CMD=$2; shift 2 ;;
    -f) FILES+=("$2"); shift 2 ;;
    -j) JOB=$2; shift 2 ;;
    -m) MEM=$2; shift 2 ;;
    -p) SMP=$2; shift 2 ;;
    -t) TIMEOUT=$2; shift 2 ;;
    --iscsid) ISCSID=1; shift ;;
    --udev) UDEV=1; shift ;;
    -v) VERBOSE=1; shift ;;
    --rebuild) REBUILD=1; shift ;;
    --build-only) BUILD_ONLY=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    -*) die "unknown option $1" ;;
    *) break ;;
  esac
done
if [ -z "$CMD" ] && [ $# -gt 0 ]; then SCRIPT=$(readlink -f "$1"); shift; fi
ARGS=("$@")
[ "$BUILD_ONLY" = 1 ] || [ -n "$CMD$SCRIPT" ] || die "nothing to run: give -c CMD or a script (-h for help)"
[ "$(id -u)" = 0 ] || die "must run as root (apt-get, 9p with security_model=none)"
[ "$MEM" -le 2048 ] || die "guest memory is capped at 2048 MiB"
mkdir -p "$CACHE/jobs"

# ------------------------------------------------------------------ host packages
# Tools copied into the guest come from these packages; qemu runs it.
HOST_PKGS="qemu-system-x86 busybox-static dmsetup thin-provisioning-tools open-iscsi tgt lvm2
  nfs-kernel-server nfs-common e2fsprogs xfsprogs btrfs-progs util-linux kmod udev bash cpio xz-utils coreutils"
install_host_packages() {
  local missing=() p rc=0
  for p in $HOST_PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]}"
  # Never start the iscsid, tgt or NFS services on the host: a policy-rc.d that
  # refuses every start, removed again unless it was there before.
  local own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; own_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  { apt-get install -y -q --no-install-recommends "${missing[@]}" ||
    { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; }; } \
    >"$CACHE/apt.log" 2>&1 || rc=$?
  [ "$own_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
  [ "$rc" = 0 ] || die "apt-get install failed, see $CACHE/apt.log"
}

# ------------------------------------------------------------------ kernel
# The newest linux-image-amd64 the apt sources offer, unpacked into $CACHE/kernel.
fetch_kernel() {
  if ! ls "$CACHE"/kernel/boot/vmlinuz-* >/dev/null 2>&1; then
    log "downloading linux-image-amd64"
    local debs=$CACHE/debs meta dep
    mkdir -p "$debs"
    ( cd "$debs" && { apt-get download -q linux-image-amd64 || { apt-get update -q && apt-get download -q linux-image-amd64; }; } ) \
      >"$CACHE/kernel.log" 2>&1 || die "apt-get download linux-image-amd64 failed, see $CACHE/kernel.log"
    meta=$(ls -t "$debs"/linux-image-amd64_*.deb | head -1)
    dep=$(dpkg-deb -f "$meta" Depends | tr ',|' '\n\n' | grep -o 'linux-image-[0-9][^ ]*' | head -1)
    [ -n "$dep" ] || die "cannot tell the kernel package from $meta"
    ( cd "$debs" && apt-get download -q "$dep" ) >>"$CACHE/kernel.log" 2>&1 || die "apt-get download $dep failed"
    rm -rf "$CACHE/kernel.tmp"
    dpkg-deb -x "$(ls -t "$debs/$dep"_*.deb | head -1)" "$CACHE/kernel.tmp"
    mv "$CACHE/kernel.tmp" "$CACHE/kernel"
  fi
  KV=$(ls "$CACHE/kernel/lib/modules" | head -1)
  [ -f "$CACHE/kernel/lib/modules/$KV/modules.dep" ] || depmod -b "$CACHE/kernel" "$KV"
}

# Kernel modules in the guest (their dependencies are added by modprobe --show-depends).
GUEST_MODULES="virtio_pci virtio_blk virtio_rng 9p 9pnet_virtio loop dm_mod dm_thin_pool dm_log_writes dm_flakey
  dm_snapshot dm_crypt dm_mirror dm_multipath dm_round_robin dm_zero ext4 xfs btrfs quota_v2 fuse overlay
  crc32c_generic crc32c_intel iscsi_tcp sd_mod sg scsi_dh_alua nbd configfs target_core_mod
  target_core_iblock target_core_file target_core_user iscsi_target_mod tcm_loop
  nvmet nvmet_tcp nvme_tcp nvme_fabrics nvme_core nfsd nfsv4 veth"
# Programs in the guest, copied with their shared libraries; busybox fills the rest.
GUEST_PROGRAMS="dmsetup pdata_tools thin_check thin_dump thin_restore thin_repair thin_ls
  thin_delta thin_trim thin_metadata_size iscsiadm iscsid iscsi-iname iscsistart tgtd tgtadm
  mke2fs mkfs.ext4 mkfs.ext3 mkfs.ext2 e2fsck fsck.ext4 resize2fs tune2fs dumpe2fs debugfs e2label
  mkfs.xfs xfs_repair xfs_growfs xfs_admin xfs_info xfs_db xfs_io mkfs.btrfs btrfs btrfstune
  fsck.btrfs losetup blkid blockdev lsblk findmnt mountpoint mount umount wipefs fallocate
  nsenter unshare kmod modprobe insmod rmmod lsmod depmod modinfo udevadm bash truncate sync
  sha256sum timeout stat dd lvm fio exportfs rpc.nfsd rpc.mountd mount.nfs mount.nfs4 umount.nfs umount.nfs4"

# copy_program HOSTPATH DESTDIR: copy an ELF (or a multi-call symlink to one)
# and every shared library it needs into the image root.
copy_program() {
  local src=$1 dir=$2 real dst lib
  real=$(readlink -f "$src"); dst=$ROOT/$dir/$(basename "$src")
  mkdir -p "$ROOT/$dir"
  if [ "$(basename "$real")" != "$(basename "$src")" ] && [ "$(dirname "$real")" = "$(readlink -f "$(dirname "$src")")" ]; then
    copy_program "$real" "$dir"   # thin_check -> pdata_tools, mkfs.ext4 -> mke2fs
    [ -e "$dst" ] || ln -s "$(basename "$real")" "$dst"
    return
  fi
  [ -e "$dst" ] || cp -L "$src" "$dst"
  for lib in $(ldd "$real" 2>/dev/null | grep -o '/[^ ]*' || true); do
    [ -e "$ROOT$lib" ] && continue
    mkdir -p "$ROOT$(dirname "$lib")"; cp -L "$lib" "$ROOT$lib"
  done
}

build_image() {
  local t0=$SECONDS tmp=$IMG.tmp m mods rel p off
  log "building guest image $(basename "$IMG")"
  rm -rf "$tmp"; mkdir -p "$tmp"; ROOT=$tmp/root
  mkdir -p "$ROOT"/{usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64,etc/iscsi,proc,sys,dev,run,tmp,job,root,var/lib/iscsi,var/tmp}
  # The NFS server's tables (exportfs, rpc.mountd) and libtirpc's netconfig.
  mkdir -p "$ROOT"/{etc/exports.d,var/lib/nfs/v4recovery}; : >"$ROOT/etc/exports"
  for p in /etc/netconfig /etc/services /etc/protocols; do [ -f "$p" ] && cp "$p" "$ROOT$p"; done
  ln -s usr/bin "$ROOT/bin"; ln -s usr/sbin "$ROOT/sbin"; ln -s usr/lib "$ROOT/lib"; ln -s usr/lib64 "$ROOT/lib64"
  ln -s /run "$ROOT/var/run"; ln -s /run/lock "$ROOT/var/lock"

  cp "$CACHE/kernel/boot/vmlinuz-$KV" "$tmp/vmlinuz"
  # An uncompressed ELF vmlinux boots through PVH and skips decompressing
  # the kernel inside the guest, which takes seconds under TCG.
  for off in $(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$tmp/vmlinuz" | cut -d: -f1); do
    tail -c +$((off + 1)) "$tmp/vmlinuz" | xz -dcq 2>/dev/null >"$tmp/vmlinux" || true
    [ "$(head -c4 "$tmp/vmlinux" | tail -c3)" = ELF ] && break
    rm -f "$tmp/vmlinux"
  done
  [ -f "$tmp/vmlinux" ] || log "warning: no vmlinux inside the bzImage; booting the compressed kernel"

  mods=$(for m in $GUEST_MODULES; do
    modprobe -d "$CACHE/kernel" -S "$KV" --show-depends "$m" 2>/dev/null || log "warning: kernel has no module $m"
  done | awk '$1 == "insmod" { print $2 }' | sort -u)
  for m in $mods; do
    rel=${m#"$CACHE/kernel/"}
    mkdir -p "$ROOT/$(dirname "$rel")"; cp "$m" "$ROOT/$rel"
  done
  cp "$CACHE/kernel/lib/modules/$KV"/modules.{builtin,builtin.modinfo,order} "$ROOT/lib/modules/$KV/"
  depmod -b "$ROOT" "$KV"

  for p in $GUEST_PROGRAMS; do
    local path
    path=$(command -v "$p") || { log "warning: no program $p on this machine"; continue; }
    case "$path" in */sbin/*) copy_program "$path" usr/sbin ;; *) copy_program "$path" usr/bin ;; esac
  done
  cp /bin/busybox "$ROOT/usr/bin/busybox"
  for p in $(/bin/busybox --list-full); do
    [ -e "$ROOT/$p" ] || [ -L "$ROOT/$p" ] || ln -s /usr/bin/busybox "$ROOT/$p"
  done

  # udev, only started with --udev; its dm rules are those of the dmsetup package.
  copy_program /lib/systemd/systemd-udevd usr/lib/systemd
  mkdir -p "$ROOT/usr/lib/udev" "$ROOT/etc/udev"
  # The hardware database (22 MB) only names USB and PCI gadgets: left out.
  ( cd /usr/lib/udev && find . -path ./hwdb.d -prune -o -name hwdb.bin -o -print0 | cpio --null -pdm --quiet "$ROOT/usr/lib/udev" )
  for p in "$ROOT"/usr/lib/udev/*; do
    [ -f "$p" ] && [ -x "$p" ] && [ "$(head -c4 "$p" | tail -c3)" = ELF ] && copy_program "/usr/lib/udev/$(basename "$p")" usr/lib/udev
  done
  rm -f "$ROOT"/usr/lib/udev/rules.d/*{systemd,hwdb,sound,joystick,keyboard,mouse,input,drm,tty,serial,fido,camera,evdev}*.rules

  printf 'root:x:0:0:root:/root:/bin/sh\n' >"$ROOT/etc/passwd"
  printf 'root:x:0:\ndisk:x:6:\ntape:x:26:\ntty:x:5:\nkvm:x:104:\n' >"$ROOT/etc/group"
  printf 'passwd: files\ngroup: files\nhosts: files\n' >"$ROOT/etc/nsswitch.conf"
  printf '127.0.0.1 localhost guest\n::1 localhost ip6-localhost\n' >"$ROOT/etc/hosts"
  ln -s /proc/self/mounts "$ROOT/etc/mtab"
  cp /etc/iscsi/iscsid.conf "$ROOT/etc/iscsi/"
  sed -i 's/^node.startup = .*/node.startup = manual/' "$ROOT/etc/iscsi/iscsid.conf"
  echo "InitiatorName=iqn.2024-01.dev.wasmcsi:vm-guest" >"$ROOT/etc/iscsi/initiatorname.iscsi"
  mkdir -p "$ROOT/etc/nvme"
  echo "nqn.2014-08.org.nvmexpress:uuid:0b5e3c8a-0000-4000-8000-00000000c0de" >"$ROOT/etc/nvme/hostnqn"
  cp /etc/mke2fs.conf "$ROOT/etc/" 2>/dev/null || true

  cat >"$ROOT/init" <<'EOF'
#!/bin/sh
export PATH=/usr/sbin:/usr/bin HOME=/root TERM=dumb
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run; mount -t tmpfs tmpfs /tmp; mkdir -p /run/lock/iscsi /run/tgtd
modprobe configfs 2>/dev/null; mount -t configfs configfs /sys/kernel/config
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
hostname guest; ip link set lo up
modprobe -a virtio_pci virtio_rng 9pnet_virtio 9p
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none job /job || echo "GUEST: cannot mount /job"
if grep -qw udev=1 /proc/cmdline; then
  # Coldplug only block devices: a full trigger costs seconds under TCG.
  /usr/lib/systemd/systemd-udevd --daemon >/dev/null 2>&1 &&
    udevadm trigger --action=add --subsystem-match=block >/dev/null 2>&1 && udevadm settle -t 30
else
  export DM_DISABLE_UDEV=1
fi
if grep -qw iscsid=1 /proc/cmdline; then
  modprobe -a iscsi_tcp sd_mod
  setsid iscsid -f </dev/null >/tmp/iscsid.log 2>&1 &
fi
read up _ </proc/uptime; echo "GUEST-READY uptime=${up}s"
cd /job
if [ "$(head -c2 /job/cmd.sh)" = '#!' ]; then RUN=/job/cmd.sh; else RUN="/bin/sh /job/cmd.sh"; fi
# The command gets its own session: a daemon calling kill(0, sig) must not take init down.
echo 255 >/tmp/.rc
setsid sh -c "$RUN $(cat /job/args 2>/dev/null) </dev/null 2>&1; echo \$? >/tmp/.rc" | tee /job/output.log
rc=$(cat /tmp/.rc); echo "$rc" >/job/rc
read up _ </proc/uptime; echo "GUEST-EXIT-CODE=$rc uptime=${up}s"
sync; umount /job 2>/dev/null; poweroff -f
exit 1   # poweroff failed: init exiting panics the kernel and panic=-1 ends qemu
EOF
  chmod +x "$ROOT/init"
  ( cd "$ROOT" && find . -print0 | cpio --null -o -H newc --owner=0:0 2>/dev/null ) >"$tmp/initrd.cpio"
  rm -rf "$ROOT"
  rm -rf "$IMG"; mv "$tmp" "$IMG"
  log "image built in $((SECONDS - t0)) s ($(du -sh "$IMG/initrd.cpio" | cut -f1) initramfs)"
}

# ------------------------------------------------------------------ main
T0=$(date +%s.%N)
install_host_packages
fetch_kernel
# shellcheck disable=SC2086 # HOST_PKGS is a word list
KEY=$({ echo "$IMAGE_REV $KV $GUEST_MODULES $GUEST_PROGRAMS"; dpkg-query -W -f='${Package}=${Version}\n' $HOST_PKGS; } | sha256sum | cut -c1-12)
IMG=$CACHE/image-$KV-$KEY
if [ "$REBUILD" = 1 ] || [ ! -f "$IMG/initrd.cpio" ]; then
  build_image
  for old in "$CACHE"/image-*; do [ "$old" = "$IMG" ] || rm -rf "$old"; done
fi
[ "$BUILD_ONLY" = 1 ] && exit 0

if [ -z "$JOB" ]; then
  # Keep the ten newest job folders of earlier runs for inspection.
  { ls -dt "$CACHE"/jobs/job.* 2>/dev/null || true; } | tail -n +10 | xargs -r rm -rf
  JOB=$(mktemp -d "$CACHE/jobs/job.XXXXXX")
else
  mkdir -p "$JOB"; JOB=$(readlink -f "$JOB")
fi
rm -f "$JOB"/{rc,output.log,console.log,cmd.sh,args}
if [ -n "$CMD" ]; then printf '#!/bin/sh\n%s\n' "$CMD" >"$JOB/cmd.sh"; else cp "$SCRIPT" "$JOB/cmd.sh"; fi
chmod +x "$JOB/cmd.sh"
[ ${#ARGS[@]} -gt 0 ] && printf '%q ' "${ARGS[@]}" >"$JOB/args"
if [ ${#FILES[@]} -gt 0 ]; then mkdir -p "$JOB/files"; cp -a "${FILES[@]}" "$JOB/files/"; fi

if [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo; then
  ACCEL=(-accel kvm -cpu host); ACCEL_NAME=kvm
else
  # shellcheck disable=SC2054 # the commas belong to qemu's -accel value
  ACCEL=(-accel tcg,thread=multi,tb-size=256 -cpu max); ACCEL_NAME=tcg
fi
APPEND="console=ttyS0 panic=-1 reboot=t udev=$UDEV iscsid=$ISCSID mitigations=off tsc=reliable no_timer_check"
if [ "$VERBOSE" = 1 ]; then APPEND+=" loglevel=7"; else APPEND+=" quiet loglevel=3"; fi
KERNEL=$IMG/vmlinuz; [ -f "$IMG/vmlinux" ] && KERNEL=$IMG/vmlinux
BIOS=(); [ -f /usr/share/qemu/qboot.rom ] && BIOS=(-bios /usr/share/qemu/qboot.rom)
QEMU=(qemu-system-x86_64 -nodefaults -no-user-config -display none -serial stdio -no-reboot
  "${ACCEL[@]}" -smp "$SMP" -m "$MEM" "${BIOS[@]}"
  -kernel "$KERNEL" -initrd "$IMG/initrd.cpio" -append "$APPEND"
  -device virtio-rng-pci
  -virtfs "local,path=$JOB,mount_tag=job,security_model=none,multidevs=remap")
# shellcheck disable=SC2206 # word splitting is the point
[ -n "${QEMU_EXTRA:-}" ] && QEMU+=($QEMU_EXTRA)
log "job $JOB; accel=$ACCEL_NAME cpus=$SMP mem=${MEM}M"
T_BOOT=$(date +%s.%N)
set +e
timeout --foreground -k 10 "$TIMEOUT" "${QEMU[@]}" </dev/null 2>"$JOB/qemu.stderr" |
  while IFS= read -r line || [ -n "$line" ]; do
    line=${line%$'\r'}
    case "$line" in GUEST-READY*) date +%s.%N >"$JOB/.t_ready" ;; esac
    printf '%s\n' "$line"; printf '%s\n' "$line" >>"$JOB/console.log"
  done
QRC=${PIPESTATUS[0]}
set -e
T_END=$(date +%s.%N)
grep -v "host doesn't support requested feature" "$JOB/qemu.stderr" >&2 || true
RC=$(cat "$JOB/rc" 2>/dev/null || true)
if [[ ! "$RC" =~ ^[0-9]+$ ]]; then
  RC=125; log "the guest reported no exit code (qemu exit $QRC; 124 means the time limit)"
fi
T_READY=$(cat "$JOB/.t_ready" 2>/dev/null || echo 0)
awk -v s="$T0" -v q="$T_BOOT" -v r="$T_READY" -v e="$T_END" -v rc="$RC" 'BEGIN {
  printf "[vm] prepare %.1fs, boot %s, command %s, total %.1fs, exit %d\n",
    q - s, (r > 0 ? sprintf("%.1fs", r - q) : "n/a"), (r > 0 ? sprintf("%.1fs", e - r) : "n/a"), e - s, rc }' >&2
exit "$RC"
