package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/pion/ice/v4"
	"github.com/pion/webrtc/v4"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/signaling"
	"github.com/rdrr/peer/swarm"
)

// Environment of a child process.
const (
	envRole   = "RDRR_E2E_ROLE"
	envHome   = "RDRR_E2E_HOME"
	envSignal = "RDRR_E2E_SIGNAL"
	envTopic  = "RDRR_E2E_TOPIC"
	envCID    = "RDRR_E2E_CID"
	envFlip   = "RDRR_E2E_FLIP"  // serve: "every" flips a byte in every slice; "<cid>:<hex>" one byte
	envLie    = "RDRR_E2E_LIE"   // serve: "have" claims every piece of what it stores and serves none
	envAddr   = "RDRR_E2E_ADDR"  // tcp-send: where to connect
	envBytes  = "RDRR_E2E_BYTES" // tcp-send, naive-send: how much to send
	envStay   = "RDRR_E2E_STAY"  // fetch: stay (serving) after done, until stdin closes
	// serve: write a CPU profile of the child to this path (benchmarks:
	// RDRR_BENCH_SERVE_PROFILE)
	envCPUProfile = "RDRR_E2E_CPUPROFILE"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(envRole); role != "" {
		os.Exit(runRole(role))
	}
	code := m.Run()
	built.remove()
	os.Exit(code)
}

// runRole runs this process as a child in role, talking to the parent by
// lines on stdout (and, for naive-send, stdin). It ends when stdin closes
// (the parent's way of saying stop), on SIGTERM, or when its work is done.
func runRole(role string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	var err error
	switch role {
	case "serve":
		err = roleServe(ctx, log)
	case "fetch":
		err = roleFetch(ctx, log)
	case "tcp-send":
		err = roleTCPSend()
	case "naive-send":
		err = roleNaiveSend()
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Printf("error %v\n", err)
		return 1
	}
	return 0
}

// untilStdinCloses returns a context that ends when the parent closes our
// stdin.
func untilStdinCloses(ctx context.Context) context.Context {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	return ctx
}

// joinSwarm makes a loopback node for the identity in home and signs it in.
func joinSwarm(ctx context.Context, log *slog.Logger, home string, src swarm.Source) (*swarm.Node, *signaling.Client, error) {
	id, _, err := swarm.InitIdentity(home)
	if err != nil {
		return nil, nil, err
	}
	node, err := swarm.NewNode(swarm.Config{Identity: id, Source: src, Loopback: true, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	sc, err := signaling.Dial(ctx, os.Getenv(envSignal), signaling.ClientConfig{Key: id.Key})
	if err != nil {
		node.Close()
		return nil, nil, err
	}
	if err := node.Start(sc); err != nil {
		return nil, nil, err
	}
	if _, err := sc.Join(ctx, os.Getenv(envTopic)); err != nil {
		return nil, nil, err
	}
	return node, sc, nil
}

func roleServe(ctx context.Context, log *slog.Logger) error {
	ctx = untilStdinCloses(ctx)
	if path := os.Getenv(envCPUProfile); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	st, err := cas.Open(os.Getenv(envHome), cas.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	var src swarm.Source = st
	if f := os.Getenv(envFlip); f != "" {
		fs := &flipSource{Source: st, every: f == "every"}
		if !fs.every {
			c, needle, _ := strings.Cut(f, ":")
			if fs.at, err = cas.ParseCID(c); err != nil {
				return err
			}
			if fs.needle, err = hex.DecodeString(needle); err != nil {
				return err
			}
		}
		src = fs
	}
	if os.Getenv(envLie) == "have" {
		src = haveLiar{st}
	}
	node, sc, err := joinSwarm(ctx, log, os.Getenv(envHome), src)
	if err != nil {
		return err
	}
	defer sc.Close()
	fmt.Printf("ready %s %d\n", node.ID(), node.BigMTU())
	<-ctx.Done()
	node.Close()
	st2 := node.Stats()
	b, _ := json.Marshal(st2)
	fmt.Printf("stats %s\n", b)
	return nil
}

// flipSource is a dishonest server: it corrupts the slices it sends.
type flipSource struct {
	swarm.Source
	every  bool    // flip the last byte of every slice (data of its last group)
	at     cas.CID // else flip the byte of blob at that starts needle
	needle []byte
}

func (f *flipSource) AppendSlice(dst []byte, c cas.CID, off, n int64) ([]byte, error) {
	start := len(dst)
	out, err := f.Source.AppendSlice(dst, c, off, n)
	if err != nil {
		return out, err
	}
	switch {
	case f.every:
		out[len(out)-1] ^= 0x55
	case c == f.at:
		if i := bytes.Index(out[start:], f.needle); i >= 0 {
			out[start+i] ^= 0x55
		}
	}
	return out, nil
}

// haveLiar is a dishonest server of another kind: in HAVE it claims
// every piece of every blob its store holds, as if downloading it, and
// it refuses every request for them (not_found). It holds nothing whole.
type haveLiar struct{ st *cas.Store }

func (h haveLiar) Stat(c cas.CID) (cas.Info, error) {
	return cas.Info{}, fmt.Errorf("%s: %w", c, cas.ErrNotFound)
}

func (h haveLiar) AppendSlice(dst []byte, c cas.CID, off, n int64) ([]byte, error) {
	return dst, fmt.Errorf("%s: %w", c, cas.ErrNotFound)
}

func (h haveLiar) PartialVerified(c cas.CID) (int64, []uint64, bool) {
	inf, err := h.st.Stat(c)
	if err != nil {
		return 0, nil, false
	}
	groups := make([]uint64, ((inf.Size+cas.GroupSize-1)/cas.GroupSize+63)/64)
	for i := range groups {
		groups[i] = ^uint64(0)
	}
	return inf.Size, groups, true
}

func (h haveLiar) AppendPartialSlice(dst []byte, c cas.CID, off, n int64) ([]byte, error) {
	return dst, fmt.Errorf("%s: %w", c, cas.ErrNotFound)
}

// fetchEvent is what the fetch role reports of its node's events.
type fetchEvent struct {
	Peer, Kind string
}

func roleFetch(ctx context.Context, log *slog.Logger) error {
	ctx = untilStdinCloses(ctx)
	c, err := cas.ParseCID(os.Getenv(envCID))
	if err != nil {
		return err
	}
	st, err := cas.Open(os.Getenv(envHome), cas.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	node, sc, err := joinSwarm(ctx, log, os.Getenv(envHome), st)
	if err != nil {
		return err
	}
	defer sc.Close()
	defer node.Close()
	topic := os.Getenv(envTopic)
	var mu sync.Mutex
	// "stored N" lines say how many bytes of the collection's shards are
	// in the store, whole and durable: what survives a SIGKILL (a shard
	// whose last byte was written may still be syncing when "progress"
	// has counted it).
	pollDone := make(chan struct{})
	var polling sync.WaitGroup
	defer polling.Wait()
	defer close(pollDone)
	polling.Add(1)
	go func() {
		defer polling.Done()
		var last int64
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-pollDone:
				return
			case <-tick.C:
			}
			if !st.Has(c) {
				continue
			}
			col, err := st.Collection(c)
			if err != nil {
				continue
			}
			var stored int64
			for _, sh := range col.Shards {
				if st.Has(sh.CID) {
					stored += sh.Size
				}
			}
			if stored != last {
				last = stored
				mu.Lock()
				fmt.Printf("stored %d\n", stored)
				mu.Unlock()
			}
		}
	}()
	start := time.Now()
	_, err = node.Fetch(ctx, st, c, swarm.FetchOptions{
		Discover: func(ctx context.Context) ([]peer.ID, error) { return sc.Peers(ctx, topic) },
		Progress: func(done, total int64) {
			mu.Lock()
			fmt.Printf("progress %d %d\n", done, total)
			mu.Unlock()
		},
	})
	if err != nil {
		return err
	}
	took := time.Since(start)
	var evs []fetchEvent
	for _, e := range node.Events() {
		evs = append(evs, fetchEvent{Peer: e.Peer.String(), Kind: e.Kind})
	}
	var banned []string
	if members, err := sc.Peers(ctx, topic); err == nil {
		for _, p := range members {
			if node.Banned(p) {
				banned = append(banned, p.String())
			}
		}
	}
	b, _ := json.Marshal(evs)
	bb, _ := json.Marshal(banned)
	mu.Lock()
	fmt.Printf("events %s\n", b)
	fmt.Printf("banned %s\n", bb)
	fmt.Printf("done %d\n", took.Nanoseconds())
	mu.Unlock()
	if os.Getenv(envStay) != "" {
		<-ctx.Done() // serve what it fetched until told to stop
	}
	return nil
}

// roleTCPSend writes RDRR_E2E_BYTES bytes to RDRR_E2E_ADDR (to each of
// its comma-separated addresses, at once): the raw loopback limit the
// transport is compared with.
func roleTCPSend() error {
	n, _ := strconv.ParseInt(os.Getenv(envBytes), 10, 64)
	addrs := strings.Split(os.Getenv(envAddr), ",")
	errs := make(chan error, len(addrs))
	for _, addr := range addrs {
		go func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			buf := make([]byte, 1<<20)
			for sent := int64(0); sent < n; {
				k, err := c.Write(buf[:min(int64(len(buf)), n-sent)])
				if err != nil {
					errs <- err
					return
				}
				sent += int64(k)
			}
			errs <- nil
		}()
	}
	var err error
	for range addrs {
		err = errors.Join(err, <-errs)
	}
	return err
}

// naiveAPI is pion as it comes, except that ICE stays on loopback (the
// network rule of these tests).
func naiveAPI() *webrtc.API {
	var se webrtc.SettingEngine
	se.SetIncludeLoopbackCandidate(true)
	se.SetIPFilter(func(ip net.IP) bool { return ip.IsLoopback() })
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
	se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
	return webrtc.NewAPI(webrtc.WithSettingEngine(se))
}

// roleNaiveSend answers the parent's offer (one line of JSON on stdin) and
// sends RDRR_E2E_BYTES bytes in 64 KiB messages on the one data channel,
// with bufferedAmountLowThreshold flow control: the naive baseline.
func roleNaiveSend() error {
	n, _ := strconv.ParseInt(os.Getenv(envBytes), 10, 64)
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	if !in.Scan() {
		return fmt.Errorf("no offer")
	}
	var offer webrtc.SessionDescription
	if err := json.Unmarshal(in.Bytes(), &offer); err != nil {
		return err
	}
	pc, err := naiveAPI().NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		return err
	}
	defer pc.Close()
	done := make(chan error, 1)
	pc.OnDataChannel(func(dc *webrtc.DataChannel) {
		low := make(chan struct{}, 1)
		dc.SetBufferedAmountLowThreshold(512 << 10)
		dc.OnBufferedAmountLow(func() {
			select {
			case low <- struct{}{}:
			default:
			}
		})
		dc.OnOpen(func() {
			go func() {
				msg := make([]byte, 64<<10)
				for sent := int64(0); sent < n; sent += int64(len(msg)) {
					for dc.BufferedAmount() > 1<<20 {
						select {
						case <-low:
						case <-time.After(100 * time.Millisecond):
						}
					}
					if err := dc.Send(msg[:min(int64(len(msg)), n-sent)]); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
		})
	})
	if err := pc.SetRemoteDescription(offer); err != nil {
		return err
	}
	answer, err := pc.CreateAnswer(nil)
	if err != nil {
		return err
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(answer); err != nil {
		return err
	}
	<-gathered
	b, _ := json.Marshal(pc.LocalDescription())
	fmt.Printf("answer %s\n", b)
	if err := <-done; err != nil {
		return err
	}
	// Stay until the parent has read everything (it closes stdin).
	io.Copy(io.Discard, os.Stdin)
	return nil
}
