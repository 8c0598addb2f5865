// Package e2e holds multi-process tests: peers in separate processes that
// talk only over loopback. The test binary re-executes itself as a child
// process in a role (RDRR_E2E_ROLE: serve, fetch, tcp-send, naive-send) so
// that the tests need no separately built binary; TestCLI drives the real
// `peer` command too, and the daemon tests run `peer daemon` processes.
//
// Dishonest peers exist only here, as roles of the test binary (serve with
// RDRR_E2E_FLIP: corrupt slices; with RDRR_E2E_LIE=have: claims in HAVE
// pieces it lacks); the `peer` command has no such mode.
//
// The acceptance tests of the swarm (TestSwarmSurvivesKills,
// TestByzantinePeers, TestSwarmChurn) run at sizes that keep `make test`
// within its budget on a 2-core machine; RDRR_E2E_FULL=1 runs
// TestSwarmSurvivesKills with a 1 GiB collection, as the swarm issue asks
// (minutes). RDRR_E2E_DEBUG=1 logs what they wait for.
//
// TestSwarmChurn spends two minutes on its clock whatever the machine
// does, on about one core of two. Tests that mostly wait, or none of whose
// checks depends on timing, run beside it (t.Parallel: after the
// sequential tests, at most -parallel at once, GOMAXPROCS by default):
// TestReplicasSelfHeal, TestGetWritesPiecesAsTheyArrive, TestCLI,
// TestDaemonAPI, TestGenerateOverSwarm and TestDaemonsOutliveSignaling.
// Those whose checks hang on CPU time stay sequential: a kill
// mid-transfer (TestSwarmSurvivesKills, TestTwoProcessResumeAfterKill), a
// speed-up measured (TestKernelEndorsementByGossip), the seeder's share
// under a capped upload (TestLeechersServeWhatTheyHave), bans before the
// fetches end (TestByzantinePeers), and the browser's pages. The `peer`
// binary is built once for the run (peerBinary).
package e2e
