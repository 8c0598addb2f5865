//go:build js

package swarm

import "syscall/js"

// dtlsChecksSignedFingerprint reports whether this browser lacks
// RTCDtlsTransport.getRemoteCertificates (Firefox, Safari). Every
// browser's DTLS refuses a certificate other than the one the remote
// description's a=fingerprint names (RFC 8122, JSEP), and the node applies
// a remote description only after its signature verified (PROTOCOL.md
// 2.2, steps 1 and 2), so there step 3 is the browser's own. Where the
// method exists (Chromium), the certificate is checked as a native peer
// checks it, and a missing one is a failure.
func dtlsChecksSignedFingerprint() bool {
	t := js.Global().Get("RTCDtlsTransport")
	if t.IsUndefined() || t.IsNull() {
		return true
	}
	m := t.Get("prototype").Get("getRemoteCertificates")
	return m.IsUndefined() || m.IsNull()
}
