# Sourced by scripts/fashion.sh and scripts/fashion-full.sh: installs Debian's
# dataset-fashion-mnist if missing and sets TRX, TRY, TEX, TEY to its IDX files (train images,
# train labels, test images, test labels). FASHION_WHO names the caller in messages.
PKG=dataset-fashion-mnist
if ! dpkg-query -W -f='${Status}' "$PKG" 2>/dev/null | grep -q "ok installed"; then
    echo "${FASHION_WHO:-fashion}: installing $PKG" >&2
    SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$PKG" ||
        { DEBIAN_FRONTEND=noninteractive $SUDO apt-get update -qq &&
          DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$PKG"; }
fi
find_file() { dpkg -L "$PKG" | grep "/$1\$" | head -n 1; }
TRX=$(find_file train-images-idx3-ubyte.gz); TRY=$(find_file train-labels-idx1-ubyte.gz)
TEX=$(find_file t10k-images-idx3-ubyte.gz);  TEY=$(find_file t10k-labels-idx1-ubyte.gz)
for f in "$TRX" "$TRY" "$TEX" "$TEY"; do
    [ -n "$f" ] && [ -r "$f" ] ||
        { echo "${FASHION_WHO:-fashion}: $PKG lacks an IDX file ($f)" >&2; exit 1; }
done
