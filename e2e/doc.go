// Package e2e holds multi-process tests: peers in separate processes that
// talk only over loopback. The test binary re-executes itself as a child
// process in a role (RDRR_E2E_ROLE: serve, fetch, tcp-send, naive-send) so
// that the tests need no separately built binary; TestCLI drives the real
// `peer` command too.
package e2e
