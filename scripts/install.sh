#!/usr/bin/env bash
# Install pycxl from this source tree into a virtual environment of its own, and link its
# command where PATH finds it. A distribution's Python (Debian 12, Ubuntu 24.04) is
# externally managed (PEP 668) and takes no `pip install`; a virtual environment takes
# one, on any Python 3.11+.
#
#   bash scripts/install.sh [EXTRA...]      extras by name, e.g. plot testbed
#
# As root: the environment in /opt/pycxl, the command linked as /usr/local/bin/pycxl (on
# root's PATH and in sudo's secure_path); on Debian and Ubuntu, what the build needs (a C
# compiler, the interpreter's headers and venv module) is installed with apt-get first.
# As a user: ~/.local/share/pycxl and ~/.local/bin/pycxl; nothing is installed system-wide.
#
# Environment: PYTHON (the interpreter; default python3), PYCXL_PREFIX (the environment's
# folder), PYCXL_BIN_DIR (where the pycxl link goes). Run again to update; to remove,
# delete the two.
set -euo pipefail
cd "$(dirname "$0")/.."

die() {
    echo "install.sh: $*" >&2
    exit 1
}

extras=()
for arg in "$@"; do
    case $arg in
        -h | --help)
            sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"
            exit 0
            ;;
        -*) die "unknown option $arg (see --help)" ;;
        *) extras+=("$arg") ;;
    esac
done

root=false
[ "$(id -u)" = 0 ] && root=true
if $root; then
    prefix=${PYCXL_PREFIX:-/opt/pycxl}
    bindir=${PYCXL_BIN_DIR:-/usr/local/bin}
else
    prefix=${PYCXL_PREFIX:-${XDG_DATA_HOME:-$HOME/.local/share}/pycxl}
    bindir=${PYCXL_BIN_DIR:-$HOME/.local/bin}
fi
python=${PYTHON:-python3}
have_apt=false
if $root && command -v apt-get >/dev/null && command -v dpkg >/dev/null; then
    have_apt=true
fi

# What this would replace: only an environment and a link of its own.
if [ -e "$prefix" ] && [ ! -f "$prefix/pyvenv.cfg" ] && [ -n "$(ls -A "$prefix")" ]; then
    die "$prefix exists and is not a virtual environment: move it away, or install" \
        "elsewhere with PYCXL_PREFIX=DIR"
fi
link=$bindir/pycxl
if [ -e "$link" ] && [ ! -L "$link" ]; then
    die "$link exists and is not a link (an earlier pip install?): remove it" \
        "(pip uninstall pycxl, or rm $link) and run this again, or link elsewhere with" \
        "PYCXL_BIN_DIR=DIR"
fi

apt_install() {
    echo "install.sh: installing $* (apt-get)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "$@" >/dev/null
}

# A fresh Debian or Ubuntu may have no Python at all.
if ! command -v "$python" >/dev/null; then
    if $have_apt && [ -z "${PYTHON:-}" ]; then
        apt_install python3 python3-venv python3-dev
    else
        die "no $python found: install Python 3.11 or later (Debian, Ubuntu: apt-get" \
            "install python3 python3-venv python3-dev), or name one with PYTHON=/path/to/python3"
    fi
fi
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "pycxl needs Python 3.11 or later; $python is $("$python" -V 2>&1)." \
        "Name another with PYTHON=/path/to/python3"

# What the build needs: the C compiler the build uses ($CC, or the one the interpreter was
# built with), C library headers, Python.h, and the venv module with pip.
mapfile -t info < <("$python" -c '
import os, sys, sysconfig
print("%d.%d" % sys.version_info[:2])
print((os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0])
print(sysconfig.get_paths()["include"])
print(os.path.realpath(sys.executable))')
pyver=${info[0]} cc=${info[1]} include=${info[2]} exe=${info[3]}
distro=false  # the interpreter is a package of this Debian or Ubuntu
command -v dpkg >/dev/null && dpkg -S "$exe" >/dev/null 2>&1 && distro=true
lacking() {  # fills need (packages that supply what is missing) and missing (in words)
    need=() missing=()
    if ! command -v "$cc" >/dev/null; then
        need+=(gcc)
        missing+=("a C compiler ($cc)")
    elif ! printf '#include <stdio.h>\nint main(void) { return 0; }\n' |
            "$cc" -x c - -o /dev/null 2>/dev/null; then
        need+=(libc6-dev)
        missing+=("C library headers (stdio.h)")
    fi
    if [ ! -f "$include/Python.h" ]; then
        need+=("python$pyver-dev")
        missing+=("the C headers of $python ($include/Python.h)")
    fi
    if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
        need+=("python$pyver-venv")
        missing+=("the venv module (with ensurepip) of $python")
    fi
}
lacking
aptable() {  # the packages apt-get can supply: a Python's parts only for its own Python
    apt=()
    for pkg in "${need[@]}"; do
        [[ $pkg == python* ]] && ! $distro && continue
        apt+=("$pkg")
    done
}
if [ ${#need[@]} -gt 0 ] && $have_apt; then
    aptable
    [ ${#apt[@]} -gt 0 ] && apt_install "${apt[@]}"
    lacking
fi
if [ ${#need[@]} -gt 0 ]; then
    what=$(printf '%s; ' "${missing[@]}")
    what=${what%; }
    aptable
    if command -v apt-get >/dev/null && [ ${#apt[@]} -eq ${#need[@]} ]; then
        die "the build needs $what. As root: apt-get install ${need[*]} (or run this" \
            "script as root), then run it again"
    fi
    die "the build needs $what. Install a C compiler and a Python 3.11+ with its headers" \
        "and venv module (or name one with PYTHON=/path/to/python3), then run this again"
fi

# The environment: reused while it runs on the same interpreter, made afresh otherwise.
[ -w . ] || die "$PWD is not writable by $(id -un), and the build writes into it (build/," \
    "pycxl.egg-info): run this as its owner, or from a copy of your own"
ident='import sys; print(sys.base_prefix, sys.version)'
if [ ! -x "$prefix/bin/python" ] ||
        [ "$("$prefix/bin/python" -c "$ident" 2>/dev/null)" != "$("$python" -c "$ident")" ]; then
    "$python" -m venv --clear "$prefix"
fi
spec=$PWD
if [ ${#extras[@]} -gt 0 ]; then
    spec="${PWD}[$(IFS=,; echo "${extras[*]}")]"
fi
"$prefix/bin/python" -m pip install -q --disable-pip-version-check --upgrade "$spec"

# The command: a link to the environment's own, which needs no activation.
mkdir -p "$bindir"
ln -sfn "$prefix/bin/pycxl" "$link"

version=$(cd / && "$prefix/bin/python" -c 'import pycxl; print(pycxl.__version__)')
echo "install.sh: pycxl $version in $prefix; command: $link" >&2
found=$(command -v pycxl || true)
if [ "$found" != "$link" ]; then
    hint=
    [ "$bindir" = "${HOME:-}/.local/bin" ] && hint=" (a new login shell adds it, now that it exists)"
    echo "install.sh: note: PATH finds ${found:-no pycxl}, not $link: put $bindir" \
         "first on PATH$hint" >&2
fi
if $root; then
    # A Python under a folder others cannot enter (a root-only home) serves root alone.
    closed=$("$prefix/bin/python" -c '
import os, sys
for d in (os.path.dirname(os.path.realpath(sys._base_executable)),
          os.path.realpath(sys.base_prefix)):
    while d != "/":
        if not os.stat(d).st_mode & 0o001:
            print(d)
            raise SystemExit
        d = os.path.dirname(d)')
    if [ -n "$closed" ]; then
        echo "install.sh: note: only root can run this pycxl: its Python lies under" \
             "$closed, which other users cannot enter; for every user, install with a" \
             "system Python (PYTHON=/usr/bin/python3)" >&2
    fi
fi
