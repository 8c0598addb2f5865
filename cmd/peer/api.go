package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/internal/atomicfile"
	"github.com/rdrr/peer/swarm"
	"github.com/rdrr/peer/swarm/api"
	"github.com/spf13/cobra"
)

// The daemon writes these into the home: the API's address (for the CLI)
// and the token that authorizes state changes (0600, made at first start).
const (
	apiAddrFile  = "api.addr"
	apiTokenFile = "api.token"
)

// apiToken reads the home's API token, making one at first start.
func (a *app) apiToken() (string, error) {
	path := filepath.Join(a.home, apiTokenFile)
	if b, err := os.ReadFile(path); err == nil {
		if t := strings.TrimSpace(string(b)); len(t) >= 32 {
			return t, nil
		}
		return "", fmt.Errorf("%s: too short to be a token; delete it to make a new one", path)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	t := hex.EncodeToString(raw[:])
	if err := os.MkdirAll(a.home, 0o700); err != nil {
		return "", err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	_, err = f.WriteString(t + "\n")
	return t, errors.Join(err, f.Close())
}

// startAPI serves the daemon's API on listen until stop is called.
func (a *app) startAPI(listen string, hooks *serveHooks) (stop func(), err error) {
	token, err := a.apiToken()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	hooks.ready = make(chan struct{})
	srv := &api.Server{
		Token:  token,
		Logger: a.log,
		Node: func() *swarm.Node {
			n, _ := hooks.node()
			return n
		},
		Providers: func(ctx context.Context, c cas.CID) ([]swarm.Provider, error) {
			n, m, err := hooks.waitNode(ctx)
			if err != nil {
				return nil, err
			}
			return (&swarm.Ranges{Node: n, Discover: m.Discover}).Providers(ctx, c)
		},
		Fetch: func(ctx context.Context, c cas.CID, progress func(done, total int64)) error {
			n, m, err := hooks.waitNode(ctx)
			if err != nil {
				return err
			}
			hooks.mu.Lock()
			st := hooks.store
			hooks.mu.Unlock()
			_, err = n.Fetch(ctx, st, c, swarm.FetchOptions{Discover: m.Discover, Providers: m.Providers, Progress: progress})
			if err == nil {
				m.AnnounceSoon() // what was fetched is served: say so now
			}
			return err
		},
		Online: func() bool {
			_, m := hooks.node()
			return m != nil && m.Online()
		},
		P2P: func() *api.P2PStatus {
			hooks.mu.Lock()
			ov, m := hooks.ov, hooks.member
			hooks.mu.Unlock()
			if ov == nil {
				return nil
			}
			return &api.P2PStatus{Addrs: ov.P2PAddrs(), Peers: len(ov.Host.Network().Peers()),
				RoutingTable: ov.DHT.RoutingTableSize(), Provided: m.Announced()}
		},
		Registry: hooks.reg,
		App: func() *api.AppConfig {
			hooks.mu.Lock()
			defer hooks.mu.Unlock()
			return hooks.app
		},
		Replicas: func(c cas.CID, r int) error {
			hooks.mu.Lock()
			repl := hooks.repl
			hooks.mu.Unlock()
			if repl == nil {
				return errors.New("this daemon keeps no replicas: it runs no p2p overlay (or is starting)")
			}
			return a.pinReplicas(repl, c, r)
		},
		Kernels: func() any {
			hooks.mu.Lock()
			k := hooks.kern
			hooks.mu.Unlock()
			if k == nil {
				return nil
			}
			return k.Status()
		},
		ReplicaStatus: func() []swarm.ReplicaStatus {
			hooks.mu.Lock()
			repl := hooks.repl
			hooks.mu.Unlock()
			if repl == nil {
				return nil
			}
			return repl.Status()
		},
	}
	addr := "http://" + ln.Addr().String()
	hs := &http.Server{ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-hooks.ready // the store is open: the API reads it
		hooks.mu.Lock()
		srv.Store = hooks.store
		hooks.mu.Unlock()
		hs.Handler = srv.Handler()
		if err := atomicfile.Write(filepath.Join(a.home, apiAddrFile), []byte(addr+"\n"), 0o644); err != nil {
			a.log.Warn("api: cannot write the address file", "err", err)
		}
		a.log.Info("api listening", "url", addr, "status_page", addr+"/", "metrics", addr+"/metrics")
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Warn("api stopped", "err", err)
		}
	}()
	return func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		hs.Shutdown(ctx)
		ln.Close()
		os.Remove(filepath.Join(a.home, apiAddrFile))
	}, nil
}

// apiGet reads a JSON answer of the daemon running on this home.
func (a *app) apiGet(path string, v any) error {
	b, err := os.ReadFile(filepath.Join(a.home, apiAddrFile))
	if err != nil {
		return fmt.Errorf("no daemon runs on %s (start one: peer daemon): %w", a.home, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", strings.TrimSpace(string(b))+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("the daemon of %s does not answer: %w", a.home, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("daemon: %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return json.Unmarshal(body, v)
}

// apiPost sends body as JSON to the daemon running on this home, with
// its token, and decodes the answer into v.
func (a *app) apiPost(path string, body, v any) error {
	b, err := os.ReadFile(filepath.Join(a.home, apiAddrFile))
	if err != nil {
		return fmt.Errorf("no daemon runs on %s (start one: peer daemon): %w", a.home, err)
	}
	tok, err := os.ReadFile(filepath.Join(a.home, apiTokenFile))
	if err != nil {
		return fmt.Errorf("the daemon's token: %w", err)
	}
	js, err := json.Marshal(body)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", strings.TrimSpace(string(b))+path, strings.NewReader(string(js)))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("the daemon of %s does not answer: %w", a.home, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("daemon: %s: %s", resp.Status, strings.TrimSpace(string(answer)))
	}
	return json.Unmarshal(answer, v)
}

// apiCommands returns status, peers and providers, which ask the running
// daemon.
func apiCommands(a *app) []*cobra.Command {
	status := &cobra.Command{
		Use:   "status",
		Short: "What the daemon running on this home is doing (peers, bytes served and fetched, store)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var st api.Status
			if err := a.apiGet("/api/v1/status", &st); err != nil {
				return err
			}
			return a.print(st, func(w io.Writer) {
				state := "offline (reconnecting)"
				if st.Online {
					state = "online"
				}
				fmt.Fprintf(w, "peer %s, %s, up %.0f s\n", st.Peer, state, st.UptimeSeconds)
				fmt.Fprintf(w, "%d peers, %d links; served %s, fetched %s; %d bad slices, %d bans\n", st.Peers, st.Swarm.Links,
					formatBytes(st.Swarm.ServedBytes), formatBytes(st.Swarm.FetchedBytes), st.Swarm.BadSlices, st.Swarm.Bans)
				fmt.Fprintf(w, "store: %d blobs, %s, %d pinned; %d fetches running\n", st.Blobs, formatBytes(st.StoreBytes), st.Pinned, st.Fetches)
				if p := st.P2P; p != nil {
					fmt.Fprintf(w, "p2p: %d peers, routing table %d, %d blobs provided\n", p.Peers, p.RoutingTable, p.Provided)
					for _, addr := range p.Addrs {
						fmt.Fprintln(w, "  "+addr)
					}
				}
			})
		},
	}
	peers := &cobra.Command{
		Use:   "peers",
		Short: "The peers the daemon running on this home is connected to",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var ps []api.PeerInfo
			if err := a.apiGet("/api/v1/peers", &ps); err != nil {
				return err
			}
			return a.print(ps, func(w io.Writer) {
				for _, p := range ps {
					fmt.Fprintf(w, "%s  %d links\n", p.ID, p.Links)
				}
			})
		},
	}
	providers := &cobra.Command{
		Use:   "providers <cid>",
		Short: "The peers of the swarm that hold a blob, asked by the daemon running on this home",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cas.ParseCID(args[0])
			if err != nil {
				return err
			}
			var ps []swarm.Provider
			if err := a.apiGet("/api/v1/providers?cid="+c.String(), &ps); err != nil {
				return err
			}
			return a.print(ps, func(w io.Writer) {
				if len(ps) == 0 {
					fmt.Fprintln(w, "no peer holds", c)
				}
				for _, p := range ps {
					fmt.Fprintf(w, "%s  %s\n", p.Peer, formatBytes(p.Size))
				}
			})
		},
	}
	return []*cobra.Command{status, peers, providers}
}
