#!/usr/bin/env bash
# Fetches MuJoCo 2.2.2 as Debian 12 packages (the library, its headers, the sample models with the
# humanoid, and the libraries libmujoco loads) and unpacks them without installing anything, for a
# machine that has no MuJoCo package (the GPU hosts run Ubuntu and reach no network: run this where
# apt knows Debian 12's packages, then carry FOLDER/root over).
#
# Usage: tools/mujoco_debs.sh FOLDER
#   then: meson setup BUILD -Dmujoco=enabled -Dmujoco_root=FOLDER/root
#   and, to run anything that loads the mujoco plugin (libmujoco's own dependencies are only there):
#         export LD_LIBRARY_PATH=FOLDER/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The libraries need glibc >= 2.34 and libstdc++ from GCC >= 11 (Ubuntu 22.04 has both).
set -euo pipefail
if [ $# -ne 1 ]; then
  sed -n '2,11p' "$0" >&2
  exit 2
fi
folder=$(mkdir -p "$1" && cd "$1" && pwd)
# libmujoco2.2.2's dependencies beyond libc6, libgcc-s1 and libstdc++6 (apt-cache depends
# libmujoco2.2.2); the samples' GLFW is for the simulate viewer, which nothing here uses.
pkgs=(libmujoco2.2.2 libmujoco-dev libmujoco-samples libccd2 liblodepng0 libqhull-r8.0 libtinyxml2-9)
mkdir -p "$folder/debs" "$folder/root"
(cd "$folder/debs" && apt-get download "${pkgs[@]}") || {
  echo "mujoco_debs: apt-get download ${pkgs[*]} failed: this needs Debian 12's package lists (apt-get update)" >&2
  exit 1
}
for deb in "$folder"/debs/*.deb; do
  dpkg -x "$deb" "$folder/root"
done
root=$folder/root
for f in usr/include/mujoco/mujoco.h usr/lib/x86_64-linux-gnu/libmujoco.so \
         usr/share/mujoco/model/humanoid/humanoid.xml; do
  [ -e "$root/$f" ] || { echo "mujoco_debs: $root/$f is missing after unpacking ${pkgs[*]}" >&2; exit 1; }
done
echo "mujoco_debs: MuJoCo unpacked in $root"
echo "  build: meson setup BUILD -Dmujoco=enabled -Dmujoco_root=$root"
echo "  run:   export LD_LIBRARY_PATH=$root/usr/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
