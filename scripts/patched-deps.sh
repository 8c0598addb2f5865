#!/usr/bin/env bash
# Builds .build/go.mod: the module's go.mod plus replace directives for
# dependencies we build with a small patch, applied at build time to the
# module cache's copy (no third-party source is kept in this repository).
# The Makefile passes -modfile=.build/go.mod to every go command; a plain
# `go build` uses the unpatched upstream modules and still works.
#
# Patches (see each file's header for why):
#   swarm/pion-sctp-mtu.patch  pion/webrtc: SettingEngine.SetSCTPMTU, so two
#                              native peers on loopback or a jumbo-frame LAN
#                              can use SCTP packets larger than 1191 bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
unset GOFLAGS # the Makefile's -modfile names the file this script makes
mkdir -p .build
patch_webrtc() {
  local mod=github.com/pion/webrtc/v4 dst=.build/pion-webrtc patch=swarm/pion-sctp-mtu.patch
  local ver src stamp
  ver=$(go list -m -f '{{.Version}}' $mod)
  stamp="$ver $(sha256sum $patch | cut -c1-16)"
  if [ ! -f $dst/.rdrr-patched ] || [ "$(cat $dst/.rdrr-patched)" != "$stamp" ]; then
    go mod download $mod
    src=$(go list -m -f '{{.Dir}}' $mod)
    rm -rf $dst
    cp -r "$src" $dst
    chmod -R u+w $dst
    (cd $dst && git apply -p1 "../../$patch")
    echo "$stamp" > $dst/.rdrr-patched
  fi
  echo "-replace=$mod=./$dst"
}
reps=$(patch_webrtc)
cp go.mod .build/next.mod
cp go.sum .build/go.sum
go mod edit -modfile=.build/next.mod $reps
mv .build/next.mod .build/go.mod
