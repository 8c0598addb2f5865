package tiers

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// latencyBuckets are the upper bounds (seconds) of the latency histograms:
// VRAM hits are microseconds, swarm misses hundreds of milliseconds.
var latencyBuckets = []float64{1e-5, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1, 3}

type levelStats struct {
	hits, misses                      int64
	bytesUp, bytesDown                int64
	evictions, failures, corrupt      int64
	prefetchQueued, prefetchDone      int64
	prefetchFailed, prefetchCancelled int64
	latency                           [11]int64 // counts per bucket (last: above)
	latencySum                        float64
}

func (s *levelStats) observe(d time.Duration) {
	sec := d.Seconds()
	s.latencySum += sec
	for i, b := range latencyBuckets {
		if sec <= b {
			s.latency[i]++
			return
		}
	}
	s.latency[len(latencyBuckets)]++
}

// LevelStats is what one level did. For VRAM and RAM a hit is a demand
// found there; for disk and swarm it is a read they served.
type LevelStats struct {
	Level             string           `json:"level"`
	Budget            int64            `json:"budget,omitempty"`
	Used              int64            `json:"used,omitempty"`
	Entries           int              `json:"entries,omitempty"`
	Hits              int64            `json:"hits"`
	Misses            int64            `json:"misses"`
	HitRate           float64          `json:"hitRate"`
	BytesUp           int64            `json:"bytesUp"`
	BytesDown         int64            `json:"bytesDown"`
	Evictions         int64            `json:"evictions"`
	Failures          int64            `json:"failures"` // reads of a source that failed (corrupt ones too; not those their caller cancelled)
	Corrupt           int64            `json:"corrupt"`
	PrefetchQueued    int64            `json:"prefetchQueued"`
	PrefetchDone      int64            `json:"prefetchDone"`
	PrefetchFailed    int64            `json:"prefetchFailed"`
	PrefetchCancelled int64            `json:"prefetchCancelled"` // queued or loading when cancelled
	QueueDepth        int              `json:"queueDepth"`
	Latency           map[string]int64 `json:"latencyBuckets"` // "le=0.001": count
	LatencySum        float64          `json:"latencySumSeconds"`
}

// Stats returns every level's counters.
func (c *Cache) Stats() []LevelStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	depth := map[Level]int{}
	for _, p := range c.pq.items {
		depth[p.level]++
	}
	out := make([]LevelStats, 0, numLevels)
	for l := VRAM; l < numLevels; l++ {
		s := &c.stats[l]
		ls := LevelStats{Level: l.String(), Hits: s.hits, Misses: s.misses, BytesUp: s.bytesUp, BytesDown: s.bytesDown,
			Evictions: s.evictions, Failures: s.failures, Corrupt: s.corrupt, PrefetchQueued: s.prefetchQueued,
			PrefetchDone: s.prefetchDone, PrefetchFailed: s.prefetchFailed, PrefetchCancelled: s.prefetchCancelled,
			QueueDepth: depth[l], Latency: map[string]int64{}, LatencySum: s.latencySum}
		if n := s.hits + s.misses; n > 0 {
			ls.HitRate = float64(s.hits) / float64(n)
		}
		if l <= RAM {
			lv := c.level(l)
			ls.Budget, ls.Used, ls.Entries = lv.budget, lv.used, len(lv.entries)
		}
		for i, b := range latencyBuckets {
			ls.Latency[prometheusFloat(b)] = s.latency[i]
		}
		ls.Latency["+Inf"] = s.latency[len(latencyBuckets)]
		out = append(out, ls)
	}
	return out
}

func prometheusFloat(f float64) string { return "le=" + time.Duration(f*float64(time.Second)).String() }

// Collector exports the stats as Prometheus metrics (rdrr_tiers_*).
func (c *Cache) Collector() prometheus.Collector { return collector{c} }

type collector struct{ c *Cache }

var (
	descHits    = prometheus.NewDesc("rdrr_tiers_hits_total", "Demands found at the level (sources: reads served).", []string{"level"}, nil)
	descMisses  = prometheus.NewDesc("rdrr_tiers_misses_total", "Demands not found at the level.", []string{"level"}, nil)
	descUp      = prometheus.NewDesc("rdrr_tiers_bytes_up_total", "Bytes brought into or served by the level.", []string{"level"}, nil)
	descDown    = prometheus.NewDesc("rdrr_tiers_bytes_evicted_total", "Bytes evicted from the level.", []string{"level"}, nil)
	descCorrupt = prometheus.NewDesc("rdrr_tiers_corrupt_total", "Reads from the level that failed verification.", []string{"level"}, nil)
	descUsed    = prometheus.NewDesc("rdrr_tiers_used_bytes", "Bytes held by the level.", []string{"level"}, nil)
	descBudget  = prometheus.NewDesc("rdrr_tiers_budget_bytes", "The level's budget.", []string{"level"}, nil)
	descQueue   = prometheus.NewDesc("rdrr_tiers_prefetch_queue", "Prefetches queued for the level.", []string{"level"}, nil)
	descLatency = prometheus.NewDesc("rdrr_tiers_load_seconds", "Time to bring a key into or out of the level.", []string{"level"}, nil)
)

func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descHits, descMisses, descUp, descDown, descCorrupt, descUsed, descBudget, descQueue, descLatency} {
		ch <- d
	}
}

func (k collector) Collect(ch chan<- prometheus.Metric) {
	k.c.mu.Lock()
	defer k.c.mu.Unlock()
	depth := map[Level]int{}
	for _, p := range k.c.pq.items {
		depth[p.level]++
	}
	for l := VRAM; l < numLevels; l++ {
		s, name := &k.c.stats[l], l.String()
		ch <- prometheus.MustNewConstMetric(descHits, prometheus.CounterValue, float64(s.hits), name)
		ch <- prometheus.MustNewConstMetric(descMisses, prometheus.CounterValue, float64(s.misses), name)
		ch <- prometheus.MustNewConstMetric(descUp, prometheus.CounterValue, float64(s.bytesUp), name)
		ch <- prometheus.MustNewConstMetric(descDown, prometheus.CounterValue, float64(s.bytesDown), name)
		ch <- prometheus.MustNewConstMetric(descCorrupt, prometheus.CounterValue, float64(s.corrupt), name)
		ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(depth[l]), name)
		if l <= RAM {
			lv := k.c.level(l)
			ch <- prometheus.MustNewConstMetric(descUsed, prometheus.GaugeValue, float64(lv.used), name)
			ch <- prometheus.MustNewConstMetric(descBudget, prometheus.GaugeValue, float64(lv.budget), name)
		}
		buckets := map[float64]uint64{}
		var n uint64
		for i, b := range latencyBuckets {
			n += uint64(s.latency[i])
			buckets[b] = n
		}
		n += uint64(s.latency[len(latencyBuckets)])
		ch <- prometheus.MustNewConstHistogram(descLatency, n, s.latencySum, buckets, name)
	}
}
