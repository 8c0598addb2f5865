// Package api is the seeding daemon's HTTP interface: a JSON API
// (/api/v1/...), Prometheus metrics (/metrics) and a status page (/) that
// refreshes itself, on one listener. Reading needs nothing; every call
// that changes state (fetch, pin) needs the daemon's token as
// "Authorization: Bearer <token>".
package api

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/swarm"
)

// Server serves the API of one daemon.
type Server struct {
	Store *cas.Store
	// Node returns the daemon's current node (nil while it reconnects).
	Node func() *swarm.Node
	// Fetch fetches c into the store, reporting progress; the daemon
	// supplies it (it knows how to find peers). Nil: /api/v1/fetch is
	// refused.
	Fetch func(ctx context.Context, c cas.CID, progress func(done, total int64)) error
	// Providers lists the peers that hold a blob (nil: refused).
	Providers func(ctx context.Context, c cas.CID) ([]swarm.Provider, error)
	// Online reports whether the daemon is signed in to its signaling
	// server (nil: whether Node returns a node).
	Online func() bool
	// P2P, if set, describes the daemon's libp2p overlay for the status.
	P2P func() *P2PStatus
	// Replicas, if set, asks for R live copies of every shard of a
	// pinned collection across the swarm (pin with "replicas"); nil:
	// such pins are refused. ReplicaStatus, if set, lists what the
	// daemon counted of the targets it knows.
	Replicas      func(c cas.CID, r int) error
	ReplicaStatus func() []swarm.ReplicaStatus
	// Kernels, if set, describes the daemon's kernel lab (device class,
	// active variants, endorsements received by gossip, pulls) for
	// GET /api/v1/kernels; nil, or a nil result: not found.
	Kernels func() any
	// App, if set, is what the browser peer served at /app/ starts with.
	App func() *AppConfig
	// Token authorizes state changes. Required.
	Token string
	// Registry, if not nil, has more collectors for /metrics.
	Registry *prometheus.Registry
	Logger   *slog.Logger

	start time.Time
	mu    sync.Mutex
	jobs  []*job
	ctx   context.Context
	stop  context.CancelFunc
}

// maxJobs bounds the fetch jobs kept (finished ones are dropped first).
const maxJobs = 256

// maxBody bounds a request body.
const maxBody = 64 << 10

type job struct {
	ID       int       `json:"id"`
	CID      cas.CID   `json:"cid"`
	State    string    `json:"state"` // running, done, failed
	Done     int64     `json:"done"`
	Total    int64     `json:"total"`
	Error    string    `json:"error,omitempty"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished,omitzero"`
}

// Handler returns the HTTP handler. Close stops the fetches it started.
func (s *Server) Handler() http.Handler {
	s.start = time.Now()
	s.ctx, s.stop = context.WithCancel(context.Background())
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	reg := s.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	reg.MustRegister(collector{s})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/status", s.status)
	mux.HandleFunc("GET /api/v1/peers", s.peers)
	mux.HandleFunc("GET /api/v1/blobs", s.blobs)
	mux.HandleFunc("GET /api/v1/partials", s.partials)
	mux.HandleFunc("GET /api/v1/fetch", s.listJobs)
	mux.HandleFunc("GET /api/v1/providers", s.providers)
	mux.HandleFunc("GET /api/v1/kernels", s.kernels)
	mux.HandleFunc("POST /api/v1/fetch", s.authorized(s.fetch))
	mux.HandleFunc("POST /api/v1/pin", s.authorized(s.pin))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /{$}", s.page)
	mux.Handle("GET /app/", s.app())
	return mux
}

// Close cancels running fetches.
func (s *Server) Close() {
	if s.stop != nil {
		s.stop()
	}
}

func (s *Server) authorized(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		want := "Bearer " + s.Token
		got := r.Header.Get("Authorization")
		if s.Token == "" || subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
			writeErr(w, http.StatusUnauthorized, "this call changes state: it needs the daemon's token (Authorization: Bearer <token>, from api.token in the peer's home)")
			return
		}
		h(w, r)
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func writeErr(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// Status is /api/v1/status.
type Status struct {
	Peer          string      `json:"peer"`
	UptimeSeconds float64     `json:"uptimeSeconds"`
	Online        bool        `json:"online"` // signed in to the swarm now
	Peers         int         `json:"peers"`
	Swarm         swarm.Stats `json:"swarm"`
	Blobs         int         `json:"blobs"`
	StoreBytes    int64       `json:"storeBytes"`
	Pinned        int         `json:"pinned"`
	Fetches       int         `json:"fetchesRunning"`
	P2P           *P2PStatus  `json:"p2p,omitempty"`
	// Replicas: the collections pinned with replicas that this daemon
	// knows of, with the live copies of their least-copied shard.
	Replicas []swarm.ReplicaStatus `json:"replicas,omitempty"`
}

// P2PStatus is the libp2p overlay's part of the status.
type P2PStatus struct {
	// Addrs are the overlay's addresses with the /p2p/ part (what
	// another daemon's --bootstrap takes).
	Addrs        []string `json:"addrs"`
	Peers        int      `json:"peers"`        // libp2p connections' peers
	RoutingTable int      `json:"routingTable"` // DHT routing table size
	Provided     int      `json:"provided"`     // blobs announced on the DHT
}

func (s *Server) statusNow() Status {
	st := Status{UptimeSeconds: time.Since(s.start).Seconds()}
	if n := s.Node(); n != nil {
		st.Peer, st.Online, st.Peers, st.Swarm = n.ID().String(), true, len(n.Peers()), n.Stats()
	}
	if s.Online != nil {
		st.Online = s.Online()
	}
	if s.P2P != nil {
		st.P2P = s.P2P()
	}
	if s.ReplicaStatus != nil {
		st.Replicas = s.ReplicaStatus()
	}
	s.Store.List(func(i cas.Info) error {
		st.Blobs++
		st.StoreBytes += i.Size
		if len(i.Pins) > 0 {
			st.Pinned++
		}
		return nil
	})
	s.mu.Lock()
	for _, j := range s.jobs {
		if j.State == "running" {
			st.Fetches++
		}
	}
	s.mu.Unlock()
	return st
}

func (s *Server) status(w http.ResponseWriter, _ *http.Request) { writeJSON(w, s.statusNow()) }

func (s *Server) kernels(w http.ResponseWriter, _ *http.Request) {
	var v any
	if s.Kernels != nil {
		v = s.Kernels()
	}
	if v == nil {
		writeErr(w, http.StatusNotFound, "this daemon runs no kernel gossip")
		return
	}
	writeJSON(w, v)
}

// PeerInfo is one entry of /api/v1/peers.
type PeerInfo struct {
	ID    string `json:"id"`
	Links int    `json:"links"`
}

func (s *Server) peerList() []PeerInfo {
	n := s.Node()
	if n == nil {
		return []PeerInfo{}
	}
	out := []PeerInfo{}
	for _, p := range n.Peers() {
		out = append(out, PeerInfo{ID: p.String(), Links: n.Links(p)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (s *Server) peers(w http.ResponseWriter, _ *http.Request) { writeJSON(w, s.peerList()) }

// blobs lists stored blobs, at most ?limit= (default 1000, at most 100000).
func (s *Server) blobs(w http.ResponseWriter, r *http.Request) {
	limit := 1000
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > 100000 {
			writeErr(w, http.StatusBadRequest, "limit: want 1 to 100000")
			return
		}
		limit = n
	}
	out := []cas.Info{}
	errStop := errors.New("enough")
	s.Store.List(func(i cas.Info) error {
		if len(out) >= limit {
			return errStop
		}
		out = append(out, i)
		return nil
	})
	writeJSON(w, out)
}

// PartialInfo is one entry of /api/v1/partials: a download in progress.
type PartialInfo struct {
	CID  string `json:"cid"` // raw
	Size int64  `json:"size"`
	// Open: a fetch has it open now, and the daemon serves and announces
	// its verified pieces; Verified and Pieces are known only then.
	Open     bool  `json:"open"`
	Verified int64 `json:"verified"` // bytes in verified 16 KiB groups
	// Pieces is the HAVE bitmap of its 1 MiB pieces held (bit i, LSB
	// first: bytes [i MiB, (i+1) MiB); swarm/PROTOCOL.md, HAVE).
	Pieces []byte `json:"pieces,omitempty"`
}

// partials lists the downloads in progress, at most maxPartials.
func (s *Server) partials(w http.ResponseWriter, _ *http.Request) {
	sizes, err := s.Store.Partials()
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	out := []PartialInfo{}
	for c, size := range sizes {
		if len(out) >= maxPartials {
			break
		}
		pi := PartialInfo{CID: c.String(), Size: size}
		if sz, groups, ok := s.Store.PartialVerified(c); ok && sz == size {
			pi.Open, pi.Pieces = true, swarm.PieceBitmap(size, groups)
			for g, w := range groups {
				for b := 0; b < 64; b++ {
					if w&(1<<b) != 0 {
						off := int64(g*64+b) * cas.GroupSize
						pi.Verified += min(cas.GroupSize, size-off)
					}
				}
			}
		}
		out = append(out, pi)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CID < out[j].CID })
	writeJSON(w, out)
}

// maxPartials bounds the downloads /api/v1/partials lists.
const maxPartials = 4096

type cidRequest struct {
	CID    string `json:"cid"`
	Reason string `json:"reason,omitempty"`
	// Replicas (pin only): keep this many live copies in the swarm.
	Replicas int `json:"replicas,omitempty"`
}

func decodeCID(w http.ResponseWriter, r *http.Request) (cas.CID, cidRequest, bool) {
	var req cidRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeErr(w, http.StatusBadRequest, "body: "+err.Error())
		return cas.CID{}, req, false
	}
	c, err := cas.ParseCID(req.CID)
	if err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return cas.CID{}, req, false
	}
	return c, req, true
}

// fetch starts fetching a CID into the store and returns the job.
func (s *Server) fetch(w http.ResponseWriter, r *http.Request) {
	c, _, ok := decodeCID(w, r)
	if !ok {
		return
	}
	if s.Fetch == nil {
		writeErr(w, http.StatusServiceUnavailable, "this daemon cannot fetch")
		return
	}
	s.mu.Lock()
	running := 0
	for _, j := range s.jobs {
		if j.State == "running" {
			running++
		}
	}
	if running >= 16 {
		s.mu.Unlock()
		writeErr(w, http.StatusTooManyRequests, "16 fetches are running; wait for one to end")
		return
	}
	j := &job{ID: len(s.jobs) + 1, CID: c, State: "running", Started: time.Now()}
	if len(s.jobs) > 0 {
		j.ID = s.jobs[len(s.jobs)-1].ID + 1
	}
	s.jobs = append(s.jobs, j)
	for len(s.jobs) > maxJobs {
		s.jobs = s.jobs[1:]
	}
	snapshot := *j
	s.mu.Unlock()
	go func() {
		err := s.Fetch(s.ctx, c, func(done, total int64) {
			s.mu.Lock()
			j.Done, j.Total = done, total
			s.mu.Unlock()
		})
		s.mu.Lock()
		j.Finished = time.Now()
		if err != nil {
			j.State, j.Error = "failed", err.Error()
		} else {
			j.State = "done"
		}
		s.mu.Unlock()
		s.Logger.Info("api: fetch ended", "cid", c, "err", err)
	}()
	w.WriteHeader(http.StatusAccepted)
	writeJSON(w, snapshot)
}

func (s *Server) jobList() []job {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]job, len(s.jobs))
	for i, j := range s.jobs {
		out[i] = *j
	}
	return out
}

func (s *Server) listJobs(w http.ResponseWriter, _ *http.Request) { writeJSON(w, s.jobList()) }

// providers answers ?cid= with the peers that hold it.
func (s *Server) providers(w http.ResponseWriter, r *http.Request) {
	c, err := cas.ParseCID(r.URL.Query().Get("cid"))
	if err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	if s.Providers == nil {
		writeErr(w, http.StatusServiceUnavailable, "this daemon cannot look up providers")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	ps, err := s.Providers(ctx, c)
	if err != nil {
		writeErr(w, http.StatusBadGateway, err.Error())
		return
	}
	if ps == nil {
		ps = []swarm.Provider{}
	}
	writeJSON(w, ps)
}

func (s *Server) pin(w http.ResponseWriter, r *http.Request) {
	c, req, ok := decodeCID(w, r)
	if !ok {
		return
	}
	reason := req.Reason
	if reason == "" {
		reason = cas.PinUser
	}
	if req.Replicas != 0 && s.Replicas == nil {
		writeErr(w, http.StatusServiceUnavailable, "this daemon keeps no replicas (it runs no overlay)")
		return
	}
	if err := s.Store.Pin(c, reason); err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, cas.ErrNotFound) {
			code = http.StatusNotFound
		}
		writeErr(w, code, err.Error())
		return
	}
	if req.Replicas != 0 {
		if err := s.Replicas(c, req.Replicas); err != nil {
			writeErr(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	writeJSON(w, map[string]any{"pinned": c.String(), "reason": reason, "replicas": req.Replicas})
}

var pageTmpl = template.Must(template.New("page").Funcs(template.FuncMap{
	"pct": func(d, t int64) string {
		if t <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f%%", 100*float64(d)/float64(t))
	},
	"mb": func(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) },
}).Parse(`<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="2">
<title>rdrr peer {{.Status.Peer}}</title>
<style>body{font:14px system-ui,sans-serif;margin:2em}table{border-collapse:collapse}td,th{padding:2px 10px;text-align:left;border-bottom:1px solid #ddd}code{font-size:12px}</style>
</head><body>
<h1>rdrr peer</h1>
<p><a href="/app/">browser peer</a> · <a href="/metrics">metrics</a></p>
<p>peer <code>{{.Status.Peer}}</code> · {{if .Status.Online}}online{{else}}offline (reconnecting){{end}} · up {{printf "%.0f" .Status.UptimeSeconds}} s</p>
<p>{{.Status.Blobs}} blobs, {{mb .Status.StoreBytes}} stored, {{.Status.Pinned}} pinned{{range .Status.Replicas}} · {{.CID}}: {{.Min}} of {{.Replicas}} live copies{{end}} · served {{mb .Status.Swarm.ServedBytes}}, fetched {{mb .Status.Swarm.FetchedBytes}} · {{.Status.Swarm.BadSlices}} bad slices, {{.Status.Swarm.Bans}} bans</p>
<h2>Peers ({{len .Peers}})</h2>
<table id="peers"><tr><th>peer</th><th>links</th></tr>
{{range .Peers}}<tr><td><code>{{.ID}}</code></td><td>{{.Links}}</td></tr>{{end}}
</table>
<h2>Transfers</h2>
<table id="transfers"><tr><th>#</th><th>cid</th><th>state</th><th>progress</th></tr>
{{range .Jobs}}<tr><td>{{.ID}}</td><td><code>{{.CID}}</code></td><td>{{.State}}{{if .Error}}: {{.Error}}{{end}}</td><td><progress max="{{.Total}}" value="{{.Done}}"></progress> {{pct .Done .Total}}</td></tr>{{end}}
</table>
</body></html>
`))

func (s *Server) page(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	data := struct {
		Status Status
		Peers  []PeerInfo
		Jobs   []job
	}{s.statusNow(), s.peerList(), s.jobList()}
	if err := pageTmpl.Execute(w, data); err != nil {
		s.Logger.Warn("api: status page", "err", err)
	}
}

// collector exports the node's and the store's counters.
type collector struct{ s *Server }

var (
	descFetched = prometheus.NewDesc("rdrr_swarm_fetched_bytes_total", "Verified bytes fetched from peers.", nil, nil)
	descServed  = prometheus.NewDesc("rdrr_swarm_served_bytes_total", "Bytes served to peers.", nil, nil)
	descBad     = prometheus.NewDesc("rdrr_swarm_bad_slices_total", "Slices from peers that failed verification.", nil, nil)
	descGood    = prometheus.NewDesc("rdrr_swarm_verified_slices_total", "Slices from peers (a piece, the rest of one, a range) that verified and were written.", nil, nil)
	descBans    = prometheus.NewDesc("rdrr_swarm_bans_total", "Peers banned.", nil, nil)
	descLinks   = prometheus.NewDesc("rdrr_swarm_links", "Open connections.", nil, nil)
	descPeers   = prometheus.NewDesc("rdrr_swarm_peers", "Connected peers.", nil, nil)
	descBlobs   = prometheus.NewDesc("rdrr_store_blobs", "Blobs stored.", nil, nil)
	descBytes   = prometheus.NewDesc("rdrr_store_bytes", "Bytes stored.", nil, nil)
	descServing = prometheus.NewDesc("rdrr_swarm_serving_bytes", "Bytes held for serving now (at most the serve budget).", nil, nil)
	descFetchB  = prometheus.NewDesc("rdrr_swarm_fetching_bytes", "Bytes the node's own requests in flight hold now (at most the fetch budget).", nil, nil)
	descFetchN  = prometheus.NewDesc("rdrr_swarm_fetch_requests", "The node's own requests in flight now.", nil, nil)
	descPeerB   = prometheus.NewDesc("rdrr_swarm_peer_bytes_total", "Verified blob bytes fetched from (in) and served to (out) a peer; the maxPeerMetrics peers that moved the most.", []string{"peer", "direction"}, nil)
)

// maxPeerMetrics bounds the peers /metrics lists (label cardinality).
const maxPeerMetrics = 256

func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descFetched, descServed, descBad, descGood, descBans, descLinks, descPeers, descBlobs, descBytes, descServing, descFetchB, descFetchN, descPeerB} {
		ch <- d
	}
}

func (k collector) Collect(ch chan<- prometheus.Metric) {
	st := k.s.statusNow()
	m := func(d *prometheus.Desc, t prometheus.ValueType, v float64) {
		ch <- prometheus.MustNewConstMetric(d, t, v)
	}
	m(descFetched, prometheus.CounterValue, float64(st.Swarm.FetchedBytes))
	m(descServed, prometheus.CounterValue, float64(st.Swarm.ServedBytes))
	m(descBad, prometheus.CounterValue, float64(st.Swarm.BadSlices))
	m(descGood, prometheus.CounterValue, float64(st.Swarm.VerifiedSlices))
	m(descBans, prometheus.CounterValue, float64(st.Swarm.Bans))
	m(descLinks, prometheus.GaugeValue, float64(st.Swarm.Links))
	m(descPeers, prometheus.GaugeValue, float64(st.Peers))
	m(descBlobs, prometheus.GaugeValue, float64(st.Blobs))
	m(descBytes, prometheus.GaugeValue, float64(st.StoreBytes))
	m(descServing, prometheus.GaugeValue, float64(st.Swarm.ServingBytes))
	m(descFetchB, prometheus.GaugeValue, float64(st.Swarm.FetchingBytes))
	m(descFetchN, prometheus.GaugeValue, float64(st.Swarm.FetchRequests))
	if n := k.s.Node(); n != nil {
		type row struct {
			p  peer.ID
			pb swarm.PeerBytes
		}
		var rows []row
		for p, pb := range n.PeerBytes() {
			rows = append(rows, row{p, pb})
		}
		sort.Slice(rows, func(i, j int) bool {
			return rows[i].pb.In+rows[i].pb.Out > rows[j].pb.In+rows[j].pb.Out
		})
		for _, r := range rows[:min(len(rows), maxPeerMetrics)] {
			ch <- prometheus.MustNewConstMetric(descPeerB, prometheus.CounterValue, float64(r.pb.In), r.p.String(), "in")
			ch <- prometheus.MustNewConstMetric(descPeerB, prometheus.CounterValue, float64(r.pb.Out), r.p.String(), "out")
		}
	}
}

// PeerIDs parses peer IDs (for clients of the API).
func PeerIDs(ps []PeerInfo) ([]peer.ID, error) {
	out := make([]peer.ID, 0, len(ps))
	for _, p := range ps {
		id, err := peer.Decode(p.ID)
		if err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, nil
}
