package swarm

// BigPacketsBuilt reports whether this binary's pion/webrtc can send SCTP
// packets larger than 1191 bytes. Upstream pion hard-codes that size; the
// Makefile builds against a copy patched with swarm/pion-sctp-mtu.patch
// (scripts/patched-deps.sh). A binary built any other way (`go install`,
// `go build` without -modfile, a program that imports this package) works
// with every peer, but native loopback and LAN transfers run about 3x
// slower; callers should say so at start-up (DESIGN.md, "The SCTP packet
// size").
func BigPacketsBuilt() bool { return bigMTUSupported() }
