//go:build js

// Command app is the browser peer, compiled to WebAssembly
// (GOOS=js GOARCH=wasm) and run by the page the daemon serves at /app/.
// It is package swarm and cas/bao, the code native peers run, over the
// browser's RTCPeerConnection and WebSocket, with a browser.Store in the
// page's storage. It gives the page's shell (static/files/app.js) one
// object, globalThis.rdrrPeer, whose methods return promises:
//
//	start({signal, topics, loopback, budget}) -> {id, storage}
//	fetch(cid, onProgress(done, total)) -> {cid, size, ms, fetched}
//	put(Uint8Array) -> cid
//	hash(cid) -> hex BLAKE3 of the bytes kept, read back from storage
//	read(cid) -> Uint8Array (verified)
//	remove(cid)
//	stats() -> {id, peers, fetched, served, blobs, used, budget, events, ...}
package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall/js"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/swarm"
	"github.com/rdrr/peer/swarm/browser"
)

type app struct {
	mu     sync.Mutex
	st     *browser.Store
	member *swarm.Member
	id     *swarm.Identity
	kv     js.Value // the shell's key-value storage: get(key), put(key, Uint8Array)
	files  js.Value
	log    *slog.Logger
}

func main() {
	a := &app{log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	shell := js.Global().Get("rdrrShell")
	a.kv, a.files = shell.Get("kv"), shell.Get("files")
	obj := js.Global().Get("Object").New()
	obj.Set("start", promised(a.start))
	obj.Set("fetch", promised(a.fetch))
	obj.Set("put", promised(a.put))
	obj.Set("hash", promised(a.hash))
	obj.Set("read", promised(a.read))
	obj.Set("remove", promised(a.remove))
	obj.Set("stats", promised(a.stats))
	js.Global().Set("rdrrPeer", obj)
	if ready := shell.Get("ready"); ready.Type() == js.TypeFunction {
		ready.Invoke()
	}
	select {} // the page's life
}

// promised makes a JavaScript function that runs f in a goroutine and
// returns a promise of its result (JSON-like values made with js.ValueOf,
// or a js.Value).
func promised(f func(ctx context.Context, args []js.Value) (any, error)) js.Func {
	return js.FuncOf(func(this js.Value, args []js.Value) any {
		args = append([]js.Value(nil), args...)
		var resolve, reject js.Value
		executor := js.FuncOf(func(this js.Value, pa []js.Value) any {
			resolve, reject = pa[0], pa[1]
			return nil
		})
		p := js.Global().Get("Promise").New(executor)
		executor.Release()
		go func() {
			v, err := f(context.Background(), args)
			if err != nil {
				reject.Invoke(js.Global().Get("Error").New(err.Error()))
				return
			}
			resolve.Invoke(v)
		}()
		return p
	})
}

// jsonValue turns v into a plain JavaScript value through JSON.
func jsonValue(v any) (js.Value, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return js.Undefined(), err
	}
	return js.Global().Get("JSON").Call("parse", string(b)), nil
}

type startOptions struct {
	Signal   string   `json:"signal"`
	Topics   []string `json:"topics"`
	Loopback bool     `json:"loopback"`
	Budget   int64    `json:"budget"`
	// Links per peer a fetch opens (0: the swarm's default, 4). Measured
	// with 2 and 4 in headless Chromium on the 2-core dev VM
	// (BenchmarkBrowserFetch, RDRR_BENCH_LINKS): no difference beyond
	// the noise (11.7-14.3 MB/s against 12.4-12.6).
	Links int `json:"links"`
}

// identity returns the page's key: the one kept in IndexedDB, or a new
// one, kept there.
func (a *app) identity(ctx context.Context) (*swarm.Identity, error) {
	v, err := browser.Await(ctx, a.kv.Call("get", "identity"))
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	var sk crypto.PrivKey
	if !v.IsNull() && !v.IsUndefined() {
		b := make([]byte, v.Length())
		js.CopyBytesToGo(b, v)
		if sk, err = crypto.UnmarshalPrivateKey(b); err != nil || sk.Type() != crypto.Ed25519 {
			a.log.Warn("identity in storage is not an Ed25519 key; making a new one", "err", err)
			sk = nil
		}
	}
	if sk == nil {
		id, err := swarm.NewIdentity()
		if err != nil {
			return nil, err
		}
		b, err := crypto.MarshalPrivateKey(id.Key)
		if err != nil {
			return nil, err
		}
		u := js.Global().Get("Uint8Array").New(len(b))
		js.CopyBytesToJS(u, b)
		if _, err := browser.Await(ctx, a.kv.Call("put", "identity", u)); err != nil {
			return nil, fmt.Errorf("identity: keep: %w", err)
		}
		return id, nil
	}
	pid, err := peer.IDFromPrivateKey(sk)
	if err != nil {
		return nil, err
	}
	return &swarm.Identity{Key: sk, ID: pid}, nil
}

func (a *app) start(ctx context.Context, args []js.Value) (any, error) {
	var opt startOptions
	if len(args) > 0 {
		s := js.Global().Get("JSON").Call("stringify", args[0]).String()
		if err := json.Unmarshal([]byte(s), &opt); err != nil {
			return nil, fmt.Errorf("start: options: %w", err)
		}
	}
	if opt.Signal == "" {
		return nil, errors.New("start: no signaling URL")
	}
	if len(opt.Topics) == 0 {
		opt.Topics = []string{"rdrr"}
	}
	a.mu.Lock()
	started := a.member != nil
	a.mu.Unlock()
	if started {
		return nil, errors.New("start: already started")
	}
	id, err := a.identity(ctx)
	if err != nil {
		return nil, err
	}
	st, err := browser.Open(ctx, browser.NewJSFiles(a.files), browser.Options{Budget: opt.Budget})
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	m, err := swarm.Start(sctx, swarm.StartOptions{
		Config:    swarm.Config{Identity: id, Source: st, Loopback: opt.Loopback, Logger: a.log, Links: opt.Links},
		SignalURL: opt.Signal,
		Topics:    opt.Topics,
	})
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	a.st, a.member, a.id = st, m, id
	a.mu.Unlock()
	return jsonValue(map[string]any{"id": id.ID.String(), "storage": a.files.Get("kind").String()})
}

func (a *app) running() (*browser.Store, *swarm.Member, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.member == nil {
		return nil, nil, errors.New("not started")
	}
	return a.st, a.member, nil
}

func cidArg(args []js.Value) (cas.CID, error) {
	if len(args) == 0 || args[0].Type() != js.TypeString {
		return cas.CID{}, errors.New("want a CID")
	}
	return cas.ParseCID(args[0].String())
}

func (a *app) fetch(ctx context.Context, args []js.Value) (any, error) {
	st, m, err := a.running()
	if err != nil {
		return nil, err
	}
	c, err := cidArg(args)
	if err != nil {
		return nil, err
	}
	var progress func(done, total int64)
	if len(args) > 1 && args[1].Type() == js.TypeFunction {
		cb := args[1]
		var last time.Time
		progress = func(done, total int64) {
			if now := time.Now(); now.Sub(last) >= 100*time.Millisecond || done == total {
				last = now
				cb.Invoke(done, total)
			}
		}
	}
	n := m.Node()
	if n == nil {
		return nil, errors.New("fetch: signed out (reconnecting)")
	}
	before := n.Stats().FetchedBytes
	t0 := time.Now()
	inf, err := n.FetchTo(ctx, st, c, swarm.FetchOptions{Discover: m.Discover, Providers: m.Providers, Progress: progress})
	if err != nil {
		return nil, err
	}
	return jsonValue(map[string]any{"cid": c.String(), "size": inf.Size, "ms": time.Since(t0).Milliseconds(),
		"fetched": n.Stats().FetchedBytes - before})
}

func (a *app) put(ctx context.Context, args []js.Value) (any, error) {
	st, m, err := a.running()
	if err != nil {
		return nil, err
	}
	if len(args) == 0 || args[0].Type() != js.TypeObject {
		return nil, errors.New("put: want a Uint8Array")
	}
	b := make([]byte, args[0].Length())
	js.CopyBytesToGo(b, args[0])
	c, err := st.Put(ctx, b)
	if err != nil {
		return nil, err
	}
	m.AnnounceSoon()
	return c.String(), nil
}

func (a *app) hash(ctx context.Context, args []js.Value) (any, error) {
	st, _, err := a.running()
	if err != nil {
		return nil, err
	}
	c, err := cidArg(args)
	if err != nil {
		return nil, err
	}
	h, err := st.Hash(ctx, c)
	if err != nil {
		return nil, err
	}
	return hex.EncodeToString(h[:]), nil
}

func (a *app) read(ctx context.Context, args []js.Value) (any, error) {
	st, _, err := a.running()
	if err != nil {
		return nil, err
	}
	c, err := cidArg(args)
	if err != nil {
		return nil, err
	}
	inf, err := st.Stat(c)
	if err != nil {
		return nil, err
	}
	b, err := st.Read(ctx, c, 0, inf.Size)
	if err != nil {
		return nil, err
	}
	u := js.Global().Get("Uint8Array").New(len(b))
	js.CopyBytesToJS(u, b)
	return u, nil
}

func (a *app) remove(ctx context.Context, args []js.Value) (any, error) {
	st, _, err := a.running()
	if err != nil {
		return nil, err
	}
	c, err := cidArg(args)
	if err != nil {
		return nil, err
	}
	return nil, st.Delete(ctx, c)
}

type peerStat struct {
	ID    string `json:"id"`
	Links int    `json:"links"`
	In    int64  `json:"in"`
	Out   int64  `json:"out"`
}

type eventStat struct {
	Peer   string `json:"peer"`
	Kind   string `json:"kind"`
	CID    string `json:"cid,omitempty"`
	Off    int64  `json:"off"`
	Len    int64  `json:"len"`
	Detail string `json:"detail"`
}

func (a *app) stats(ctx context.Context, args []js.Value) (any, error) {
	st, m, err := a.running()
	if err != nil {
		return nil, err
	}
	out := map[string]any{"id": a.id.ID.String(), "online": m.Online(), "cert_check": certCheck()}
	used, budget := st.Used()
	out["used"], out["budget"], out["blobs"] = used, budget, st.Blobs()
	if n := m.Node(); n != nil {
		s := n.Stats()
		out["fetched"], out["served"], out["bad_slices"], out["bans"] = s.FetchedBytes, s.ServedBytes, s.BadSlices, s.Bans
		pb := n.PeerBytes()
		var peers []peerStat
		for _, p := range n.Peers() {
			peers = append(peers, peerStat{ID: p.String(), Links: n.Links(p), In: pb[p].In, Out: pb[p].Out})
		}
		out["peers"] = peers
		var evs []eventStat
		banned := []string{}
		seen := map[peer.ID]bool{}
		for _, e := range n.Events() {
			ev := eventStat{Peer: e.Peer.String(), Kind: e.Kind, Off: e.Off, Len: e.Len, Detail: e.Detail}
			if !e.CID.IsZero() {
				ev.CID = e.CID.String()
			}
			evs = append(evs, ev)
			if !seen[e.Peer] && n.Banned(e.Peer) {
				banned = append(banned, e.Peer.String())
			}
			seen[e.Peer] = true
		}
		out["events"], out["banned"] = evs, banned
	}
	return jsonValue(out)
}

// certCheck says how this browser's links check the peer's DTLS
// certificate (swarm/PROTOCOL.md 2.2, step 3): "getRemoteCertificates"
// where swarm reads it and compares it with the signed fingerprints (a
// link whose certificate does not match closes), "dtls" where the browser
// lacks the method and its DTLS stack enforces the signed SDP fingerprint.
// The same test as swarm's, for the page to show.
func certCheck() string {
	t := js.Global().Get("RTCDtlsTransport")
	if t.Type() != js.TypeFunction || t.Get("prototype").Get("getRemoteCertificates").Type() != js.TypeFunction {
		return "dtls"
	}
	return "getRemoteCertificates"
}
