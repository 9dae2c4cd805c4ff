#!/usr/bin/env bash
# Set up everything lakefuse needs on a Debian machine (run as root): system packages,
# then a Python virtual environment in .venv with lakefuse installed (editable) and its
# test extras.  Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_pkgs=()
command -v fusermount3 >/dev/null 2>&1 || apt_pkgs+=(fuse3)
pkg-config --exists fuse3 2>/dev/null || apt_pkgs+=(libfuse3-dev pkg-config)
command -v patch >/dev/null 2>&1 || apt_pkgs+=(patch)  # the vendored pyfuse3's passthrough patch
command -v gcc >/dev/null 2>&1 || apt_pkgs+=(gcc)
[ -f /usr/include/getopt.h ] || apt_pkgs+=(libc6-dev)  # C headers (Debian's gcc only recommends them)
# graveler._crecord hashes entry identities with OpenSSL's libcrypto (hashlib's library) directly
[ -f /usr/include/openssl/evp.h ] || apt_pkgs+=(libssl-dev)
# Spark (graveler.spark) needs a Java 17+ runtime; Debian's headless JRE is enough.
java_ok() { command -v java >/dev/null 2>&1 && java -version 2>&1 | grep -Eq 'version "(1[7-9]|2[0-9])'; }
java_ok || apt_pkgs+=(openjdk-17-jre-headless)
# pjdfstest (the POSIX suite run on a branch tree by the slow mount tests) is built from source
command -v autoreconf >/dev/null 2>&1 || apt_pkgs+=(autoconf automake libtool)
command -v make >/dev/null 2>&1 || apt_pkgs+=(make)
command -v prove >/dev/null 2>&1 || apt_pkgs+=(perl)
command -v strace >/dev/null 2>&1 || apt_pkgs+=(strace)  # tests/test_mount_durability.py counts the daemon's syncs
# tools the writable-mount tests drive through a branch tree
command -v rsync >/dev/null 2>&1 || apt_pkgs+=(rsync)
command -v git >/dev/null 2>&1 || apt_pkgs+=(git)
# the postgres KV backend's tests run a throwaway cluster with Debian's server binaries
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || apt_pkgs+=(postgresql)
command -v openssl >/dev/null 2>&1 || apt_pkgs+=(openssl)  # a self-signed certificate for the PostgreSQL TLS test

PY="${PYTHON:-python3}"
py_ok() {
    command -v "$1" >/dev/null 2>&1 &&
        "$1" -c 'import sys, venv, ensurepip; assert sys.version_info >= (3, 11)' >/dev/null 2>&1 &&
        [ -f "$("$1" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ]
}
if ! py_ok "$PY"; then
    apt_pkgs+=(python3 python3-venv python3-dev)
    PY=/usr/bin/python3
fi

if [ ${#apt_pkgs[@]} -gt 0 ]; then
    echo "setup: installing ${apt_pkgs[*]} (apt)"
    if [ "$(id -u)" != 0 ]; then
        echo "setup: need root to install ${apt_pkgs[*]}" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt_pkgs[@]}" >/dev/null
fi
py_ok "$PY" || { echo "setup: no Python >= 3.11 with venv and headers found" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $("$PY" --version)"
    "$PY" -m venv .venv
fi
stamp=.venv/.lakefuse-installed
# The compiled hot path (graveler/**/*.pyx, built in place by `pip install -e .`): rebuild when a .pyx, .pxd or
# setup.py changed since the last install, or when the built modules are missing (a fresh clone, git clean).
compiled_check='import graveler._crecord, graveler._centries, graveler._clru, graveler.sstable._csha256, graveler.sstable._cblock, graveler.sstable._ctable, graveler.sstable._crange, graveler.committed._cfnv, graveler.committed._capply, graveler.committed._cdiff'
# The built modules and where the venv's lakefuse comes from are checked in one call from outside the
# checkout: an editable install of another checkout (a removed git worktree) is reinstalled too.
here="$(pwd -P)"
installed_from="$(cd / && "$here/.venv/bin/python" -c "$compiled_check"'; import lakefuse, os; print(os.path.dirname(os.path.dirname(os.path.realpath(lakefuse.__file__))))' 2>/dev/null || true)"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] ||
    [ -n "$(find graveler \( -name '*.pyx' -o -name '*.pxd' \) -newer "$stamp" -print -quit)" ] ||
    [ "$installed_from" != "$here" ]; then
    echo "setup: installing lakefuse (building its compiled hot path) and its dependencies into .venv"
    .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v '^WARNING' || true
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[fuse,spark,postgres,test]' 2>&1 | grep -v '^WARNING' || true
    # fails loudly if the install (or the build of the compiled modules) did
    .venv/bin/python -c "import graveler, lakefuse, pyfuse3, lmdb, diskcache, rocksdict, pyspark, pyarrow, pandas, psycopg, psycopg_pool; $compiled_check"
    touch "$stamp"
fi

# FUSE passthrough (reads of committed local objects served by the kernel from the object file):
# Debian 12's libfuse 3.14 and PyPI's pyfuse3 lack it, so libfuse 3.17 and pyfuse3 are built from
# the tarballs in scripts/vendor (see its README), pyfuse3 with a small patch, into .venv; meson and
# ninja come from PyPI. Rebuilt only when a vendored file changed or the module does not load.
vendor=scripts/vendor
root="$PWD"
fuse_prefix="$root/.venv/opt/libfuse"
pt_stamp=.venv/.lakefuse-passthrough
pt_sum="$(cat "$vendor"/fuse3_*.orig.tar.gz "$vendor"/pyfuse3-*.tar.gz "$vendor"/pyfuse3-passthrough.patch | sha256sum | cut -d' ' -f1)"
pt_check='import pyfuse3; assert hasattr(pyfuse3, "passthrough_open") and hasattr(pyfuse3.FileInfo, "noflush") and hasattr(pyfuse3, "readdir_reply_many") and hasattr(pyfuse3, "direct_io_mmap_enabled") and hasattr(pyfuse3.Operations, "readdirplus_auto") and hasattr(pyfuse3, "Reply") and hasattr(pyfuse3, "finish_started") and hasattr(pyfuse3.Operations, "fallocate") and hasattr(pyfuse3, "receive_spin_stats"), "pyfuse3 without the (current) patch"'
if [ "$(cat "$pt_stamp" 2>/dev/null)" != "$pt_sum" ] || ! .venv/bin/python -c "$pt_check" >/dev/null 2>&1; then
    echo "setup: building libfuse and pyfuse3 with FUSE passthrough from $vendor"
    .venv/bin/python -m pip install -q --disable-pip-version-check meson ninja 2>&1 | grep -v '^WARNING' || true
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    tar -xzf "$vendor"/fuse3_*.orig.tar.gz -C "$work"
    tar -xzf "$vendor"/pyfuse3-*.tar.gz -C "$work"
    (
        export PATH="$root/.venv/bin:$PATH"
        cd "$work"/fuse-*/
        rm -rf "$fuse_prefix"
        meson setup build --prefix="$fuse_prefix" --libdir=lib --buildtype=release -Dexamples=false -Dutils=false \
            -Dtests=false -Duseroot=false -Dinitscriptdir= -Dudevrulesdir="$fuse_prefix/udev" >"$work/meson.log" 2>&1 ||
            { cat "$work/meson.log" >&2; exit 1; }
        ninja -C build install >"$work/ninja.log" 2>&1 || { cat "$work/ninja.log" >&2; exit 1; }
    )
    (
        cd "$work"/pyfuse3-*/
        patch -p1 --quiet --forward <"$root/$vendor/pyfuse3-passthrough.patch"
        rm -f src/pyfuse3/__init__.c  # generated from the unpatched .pyx: Cython regenerates it
        # the rpath lets the extension load our libfuse3 without LD_LIBRARY_PATH (no clash with the system's)
        PKG_CONFIG_PATH="$fuse_prefix/lib/pkgconfig" LDFLAGS="-Wl,-rpath,$fuse_prefix/lib" \
            "$root/.venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall . 2>&1 |
            grep -v '^WARNING' || true
    )
    .venv/bin/python -c "$pt_check"
    echo "$pt_sum" >"$pt_stamp"
fi

# xfstests' fsx (the file-operation exerciser run by tests/test_mount_fsx.py): no package
# registry here carries it, so its source is vendored (see scripts/vendor/README.md) and built
# with gcc into .venv/opt/fsx, again only when the tarball changes. The config.h that xfstests'
# autoconf would write is the few HAVE_ lines its global.h looks at on Linux.
fsx_dir="$root/.venv/opt/fsx"
fsx_sum="$(sha256sum "$vendor"/xfstests-fsx-*.tar.gz | cut -d' ' -f1)"
if [ "$(cat "$fsx_dir/.stamp" 2>/dev/null)" != "$fsx_sum" ] || [ ! -x "$fsx_dir/fsx" ]; then
    echo "setup: building fsx from $vendor"
    rm -rf "$fsx_dir"
    mkdir -p "$fsx_dir/src"
    tar -xzf "$vendor"/xfstests-fsx-*.tar.gz -C "$fsx_dir/src" --strip-components=1
    for h in SYS_TYPES_H SYS_STAT_H SYS_TIME_H SYS_IOCTL_H SYS_WAIT_H MALLOC_H STDLIB_H UNISTD_H ERRNO_H \
        STRING_H SYS_FCNTL_H SYS_PARAM_H STRINGS_H LINUX_FALLOC_H SYS_MMAN_H ASSERT_H ERR_H COPY_FILE_RANGE; do
        echo "#define HAVE_$h 1"
    done >"$fsx_dir/src/config.h"
    gcc -O2 -D_GNU_SOURCE -include getopt.h -I"$fsx_dir/src" -I"$fsx_dir/src/src" -o "$fsx_dir/fsx" "$fsx_dir/src/ltp/fsx.c" \
        2>"$fsx_dir/build.log" || { cat "$fsx_dir/build.log" >&2; exit 1; }
    echo "$fsx_sum" >"$fsx_dir/.stamp"
fi
echo "setup: ready (.venv/bin/lakefuse)"
