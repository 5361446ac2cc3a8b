#!/bin/sh
# Finishes the gpuready image's base once Debian's python3-minimal and libpython3.11-stdlib are
# installed. Run as root inside the image being built, by deploy/Dockerfile (on debian:bookworm-slim)
# and by testbed/realcluster/build-image.sh (on a rootfs made with mmdebstrap): the one recipe of
# both, so their images differ by what Debian put under it alone.
set -eu
umask 022
# No bytecode from imports: only compileall writes it, in the one form below (an import would
# leave timestamp-checked files that compileall then counts as done).
export PYTHONDONTWRITEBYTECODE=1

# What dpkg-excludes keeps out of packages installed from now on, removed from those already there
# (the slim base's own packages).
# (busybox's find has no -delete; one rmdir per directory, deepest first, empties nested ones.)
if [ -d /usr/share/doc ]; then
  find /usr/share/doc -mindepth 1 -depth ! -name copyright ! -type d -exec rm -f {} +
  find /usr/share/doc -mindepth 1 -depth -type d -empty -exec rmdir {} \;
fi
rm -rf /usr/share/man/* /usr/share/locale/* /usr/share/info/* /usr/share/lintian/* /usr/lib/*/gconv
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb

# Debian compiles its Python modules at install time with timestamp-checked bytecode of the files'
# mtimes, which no image keeps stable. Compiled again instead, with unchecked hashes (an image's
# sources never change under it: no stat or hash per import) and a fixed hash seed (the order of
# frozenset constants follows string hashes), so the same sources give the same bytes. Without
# bytecode the plugin's first start would compile its imports: about 0.2 s before its first slice.
find / -xdev -depth -type d -name __pycache__ -exec rm -rf {} +
stdlib=$(python3 -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')
for dir in "$stdlib" /usr/lib/python3/dist-packages /usr/share/python3; do
  [ -d "$dir" ] || continue
  PYTHONHASHSEED=0 python3 -m compileall -q -f -j 0 --invalidation-mode unchecked-hash "$dir" >/dev/null
done

# The controller's Deployment runs as this user (uid and gid 65532, the chart's runAsUser); the
# plugin's DaemonSet runs as root. Written directly: the base has no useradd.
grep -q '^gpuready:' /etc/group || echo 'gpuready:x:65532:' >>/etc/group
grep -q '^gpuready:' /etc/passwd || echo 'gpuready:x:65532:65532:gpuready:/nonexistent:/usr/sbin/nologin' >>/etc/passwd
