#!/bin/sh
# Python virtual environment for notebooks/ and paper-figures/ (never needed by the C toolkit).
# Usage: python-venv.sh VENV REQUIREMENTS. Creates VENV with python3 -m venv (installing Debian's
# python3-venv when ensurepip is missing and we are root), installs the pinned REQUIREMENTS from
# PyPI, and copies REQUIREMENTS to VENV/.requirements.txt as the up-to-date stamp.
set -eu
V=$1
R=$2
PY=${PYTHON3:-python3}
if ! [ -x "$V/bin/python" ]; then
    echo "python-venv: creating $V with $($PY --version 2>&1)" >&2
    if ! "$PY" -m venv "$V" 2>/dev/null; then
        rm -rf "$V"
        if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
            echo "python-venv: installing python3-venv (ensurepip) with apt-get" >&2
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null ||
                { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; }
        fi
        "$PY" -m venv "$V"
    fi
fi
echo "python-venv: pip install -r $R" >&2
"$V/bin/python" -m pip install --quiet --disable-pip-version-check -r "$R"
cp "$R" "$V/.requirements.txt"
