//go:build !js

package swarm

// dtlsChecksSignedFingerprint reports whether a link whose peer
// certificate cannot be read may rely on the DTLS stack having checked it
// against the signed SDP fingerprint. pion shows every certificate, so a
// missing one is a failure.
func dtlsChecksSignedFingerprint() bool { return false }
