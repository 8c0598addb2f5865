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
#                              can use SCTP packets larger than 1191 bytes,
#                              and SCTPTransport.SetMTU, one connection's
#                              size (an offerer learns it from the answer).
#   swarm/pion-sctp-alloc.patch    pion/sctp: a DATA packet is marshalled
#                              into one recycled buffer, and a message's
#                              fragments share one copy of it (CPU per
#                              byte); packets of any size are read.
#   swarm/pion-dtls-records.patch  pion/dtls: an application data record is
#                              built and encrypted in place in one buffer, and
#                              received in one copy (CPU per byte); datagrams
#                              of any size are read.
#   swarm/pion-ice-recv-mtu.patch  pion/ice: datagrams of any size are read
#                              (16 KiB SCTP packets on loopback).
#   swarm/pion-dtls-read-owned.patch  pion/dtls: Conn.ReadOwned hands each
#                              record's payload over in a buffer the reader
#   swarm/pion-sctp-read-owned.patch  keeps, and pion/sctp keeps it so (CPU
#                              per byte: two copies fewer per packet).
#   swarm/pion-sctp-release-owned.patch  pion/sctp gives each such buffer
#   swarm/pion-dtls-release-owned.patch  back once its user data is read
#                              out, and pion/dtls reuses it (CPU per byte:
#                              no new 16 KiB buffer a packet to collect).
#   swarm/pion-dtls-direct-io.patch  pion/dtls: records are written, and
#                              read after the handshake, without a goroutine
#                              each (CPU per packet).
#   swarm/pion-ice-handoff.patch   pion/ice: Conn.SetReadHandler hands each
#                              received datagram over as it is read, and
#   swarm/pion-mux-handoff.patch   pion/webrtc: the mux takes them so (CPU
#                              per byte: two copies and a goroutine switch
#                              fewer per datagram).
#   swarm/pion-mux-buffer.patch  pion/webrtc: SettingEngine.
#                              SetReceiveBufferSize bounds the queue of
#                              received datagrams between ICE and DTLS (1 MB
#                              fixed: bursts across long round trips were
#                              dropped there).
#   swarm/pion-mux-queue.patch  pion/webrtc: that queue is held in pooled
#                              64 KiB chunks, not a ring that grows by a
#                              quarter at a time (CPU of many connections).
#   swarm/pion-sctp-cwnd.patch  pion/sctp: the congestion window starts at
#                              ten packets, as Chrome's dcSCTP (slow start
#                              across long round trips).
set -euo pipefail
cd "$(dirname "$0")/.."
unset GOFLAGS # the Makefile's -modfile names the file this script makes
mkdir -p .build
# patch_module MOD DST PATCH...: a copy of MOD from the module cache in
# DST with the PATCHes applied (redone when the version or a patch
# changes); prints the replace flag for go mod edit.
patch_module() {
  local mod=$1 dst=$2
  shift 2
  local ver src stamp
  ver=$(go list -m -f '{{.Version}}' $mod)
  stamp="$ver $(cat "$@" | sha256sum | cut -c1-16)"
  if [ ! -f $dst/.rdrr-patched ] || [ "$(cat $dst/.rdrr-patched)" != "$stamp" ]; then
    go mod download $mod
    src=$(go list -m -f '{{.Dir}}' $mod)
    rm -rf $dst
    cp -r "$src" $dst
    chmod -R u+w $dst
    for p in "$@"; do
      # The ceiling keeps git from finding this repository above $dst:
      # inside a repository, git apply skips paths outside the current
      # directory, silently.
      (cd $dst && GIT_CEILING_DIRECTORIES="$(dirname "$PWD")" git apply -p1 "$OLDPWD/$p")
    done
    echo "$stamp" > $dst/.rdrr-patched
  fi
  echo "-replace=$mod=./$dst"
}
patch_webrtc() {
  patch_module github.com/pion/webrtc/v4 .build/pion-webrtc swarm/pion-sctp-mtu.patch swarm/pion-mux-handoff.patch swarm/pion-mux-buffer.patch swarm/pion-mux-queue.patch
}
patch_sctp() {
  patch_module github.com/pion/sctp .build/pion-sctp swarm/pion-sctp-alloc.patch swarm/pion-sctp-read-owned.patch swarm/pion-sctp-release-owned.patch swarm/pion-sctp-cwnd.patch
}
patch_dtls() {
  patch_module github.com/pion/dtls/v3 .build/pion-dtls swarm/pion-dtls-records.patch swarm/pion-dtls-read-owned.patch swarm/pion-dtls-release-owned.patch swarm/pion-dtls-direct-io.patch
}
patch_ice() {
  patch_module github.com/pion/ice/v4 .build/pion-ice swarm/pion-ice-recv-mtu.patch swarm/pion-ice-handoff.patch
}
reps="$(patch_webrtc) $(patch_sctp) $(patch_dtls) $(patch_ice)"
cp go.mod .build/next.mod
cp go.sum .build/go.sum
go mod edit -modfile=.build/next.mod $reps
mv .build/next.mod .build/go.mod
