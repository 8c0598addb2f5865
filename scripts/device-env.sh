# Sourced by the scripts that run on the lent accelerator machine: unpacks
# the Vulkan loader and glvnd debs carried in .gl (NVIDIA's Vulkan ICD is
# libGLX_nvidia, which needs glvnd; see gpu/bench-device.sh), points the
# loader at NVIDIA's ICD and makes XDG_RUNTIME_DIR. Elsewhere (no
# /usr/local/nvidia) it unpacks nothing.
if [ -d /usr/local/nvidia ]; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES=$icd
export XDG_RUNTIME_DIR=/tmp/rdrr-xdg
mkdir -p -m 0700 "$XDG_RUNTIME_DIR"
