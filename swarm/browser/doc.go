// Package browser is the browser peer's side of the swarm: the store a
// page keeps its blobs in (Store, over the page's storage through Files:
// OPFS, IndexedDB where OPFS is missing, or memory), and, in files built
// for js/wasm only, the bindings of that storage and of the page's
// identity. The wasm program itself is swarm/browser/app; its page, shell
// and binary are embedded by swarm/browser/static and served by the daemon
// at /app/ (swarm/api).
//
// The protocol and its verification are not here: the page runs package
// swarm (pion over the browser's RTCPeerConnection) and cas/bao compiled
// to WebAssembly, the same code native peers run. What this package owns
// is what differs in a browser: where bytes are kept, under which budget,
// and that nothing is kept before it is verified.
package browser
