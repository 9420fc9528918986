#!/bin/sh
# Doxygen input filter for include/tpk/*.h (docs/Doxyfile): the headers' plain C comments become
# documentation comments without changing the headers. A comment starting a line documents the
# declaration after it (/* → /**); one after a member or enumerator on its line documents that
# member (/* → /**<). The file's first comment (its one-line purpose) becomes the file's brief.
sed -e '1s|^/\* |/** @file\n * |' \
    -e 's|^\([[:space:]]*\)/\* |\1/** |' \
    -e 's|\([;,{]\)\([[:space:]]*\)/\* |\1\2/**< |' "$1"
