package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/experts"
	"github.com/rdrr/peer/tiers"
	"github.com/spf13/cobra"
)

// tiersCommands returns `peer tiers` with simulate and stats.
func tiersCommands(a *app) []*cobra.Command {
	cmd := &cobra.Command{Use: "tiers", Short: "The VRAM/RAM/disk/swarm cache: policy simulation and statistics"}
	cmd.AddCommand(tiersSimulateCmd(a), tiersStatsCmd(a))
	return []*cobra.Command{cmd}
}

func tiersSimulateCmd(a *app) *cobra.Command {
	var shape, tracePath, out string
	var budgets []float64
	var withPrefetches string
	p := tiers.DefaultMoETrace
	cmd := &cobra.Command{
		Use:   "simulate [--trace file | --shape mixtral|deepseek] [--budget 0.1,0.25,0.5]",
		Short: "Replay an expert access trace against every eviction policy and Belady's MIN at several budgets",
		Long: `simulate replays a trace (TRACE.md's format: one recorded by the pager, or a
synthetic MoE routing trace with skewed popularity and per-token reuse) against
lru, lfu, cost (GreedyDual-Size-Frequency), cycle (learns the layer cycle
from reuse gaps; stale entries first) and forecast (the expected next use,
from use rates it learns by recency, frequency and the step's token; it
needs the trace's key groups and steps' tokens, which traces recorded by
peer generate have, and is LRU without groups) and against Belady's MIN,
the best any policy can do, at each budget (a fraction of all experts'
bytes). Where a trace's keys have groups, the accesses of keys in none (a
model's dense tensors, which peer generate records as it loads them) are
left out: no expert level holds them.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 && (args[0] == "vram" || args[0] == "ram" || args[0] == "all") {
				return fmt.Errorf("%q: a level of --with-prefetches takes an =: --with-prefetches=%s", args[0], args[0])
			}
			return cobra.NoArgs(cmd, args)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Which prefetches replay: none (nil), all of them (the
			// trace as read) or the run's to one level.
			var prefetched func(*tiers.Trace) *tiers.Trace
			switch withPrefetches {
			case "", "false":
			case "all", "true":
				prefetched = func(t *tiers.Trace) *tiers.Trace { return t }
			case "vram", "ram": // the run's own prefetches to that level
				lvl := tiers.VRAM
				if withPrefetches == "ram" {
					lvl = tiers.RAM
				}
				prefetched = func(t *tiers.Trace) *tiers.Trace { return t.PrefetchesTo(lvl) }
			default:
				return fmt.Errorf("--with-prefetches %q: want all, vram or ram", withPrefetches)
			}
			var tr *tiers.Trace
			if tracePath != "" {
				f, err := os.Open(tracePath)
				if err != nil {
					return err
				}
				defer f.Close()
				if tr, err = tiers.ReadTrace(f); err != nil {
					return err
				}
				// A trace peer generate recorded has its dense tensors'
				// reads at load too: keys in no group, which no expert
				// level holds. Where some keys have groups, the others
				// are left out (budgets are fractions of the experts).
				if g := tr.Grouped(); len(g.Accesses) > 0 && len(g.Accesses) < len(tr.Accesses) {
					a.log.Info("tiers simulate: the accesses of keys in no group (a model's dense tensors) are left out", "accesses", len(tr.Accesses)-len(g.Accesses))
					tr = g
				}
			} else {
				base := tiers.DefaultMoETrace
				if shape == "deepseek" {
					base = tiers.DeepSeekMoETrace
				} else if shape != "mixtral" {
					return fmt.Errorf("--shape %q (want mixtral or deepseek)", shape)
				}
				for _, f := range []string{"tokens", "skew", "reuse", "seed"} {
					if !cmd.Flags().Changed(f) {
						switch f {
						case "tokens":
							p.Tokens = base.Tokens
						case "skew":
							p.Skew = base.Skew
						case "reuse":
							p.Reuse = base.Reuse
						case "seed":
							p.Seed = base.Seed
						}
					}
				}
				p.Layers, p.Experts, p.TopK, p.ExpertBytes = base.Layers, base.Experts, base.TopK, base.ExpertBytes
				var err error
				if tr, err = tiers.SyntheticMoETrace(p); err != nil {
					return err
				}
			}
			if out != "" {
				f, err := os.Create(out)
				if err != nil {
					return err
				}
				if err := tr.Write(f); err != nil {
					f.Close()
					return err
				}
				if err := f.Close(); err != nil {
					return err
				}
			}
			var rs []tiers.SimResult
			if prefetched != nil {
				rs = tiers.ReportWithPrefetches(prefetched(tr), budgets)
			} else {
				rs = tiers.Report(tr, budgets)
			}
			return a.print(map[string]any{"keys": len(tr.Keys), "accesses": len(tr.Accesses), "results": rs}, func(w io.Writer) {
				fmt.Fprintf(w, "%d keys, %d accesses\n", len(tr.Keys), len(tr.Accesses))
				tiers.PrintReport(w, tr, rs)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&tracePath, "trace", "", "a trace file (TRACE.md); default: a synthetic MoE trace")
	f.StringVar(&shape, "shape", "deepseek", "routing shape of the synthetic trace: mixtral (32 layers, 8 experts, top-2) or deepseek (58 x 256, top-8)")
	f.IntVar(&p.Tokens, "tokens", 0, "tokens of the synthetic trace")
	f.Float64Var(&p.Skew, "skew", 0, "Zipf exponent of expert popularity")
	f.Float64Var(&p.Reuse, "reuse", 0, "chance that an expert of the last token is chosen again")
	f.Uint64Var(&p.Seed, "seed", 0, "seed of the synthetic trace")
	f.Float64SliceVar(&budgets, "budget", []float64{0.1, 0.25, 0.5}, "budgets as fractions of all experts' bytes")
	f.StringVarP(&out, "out", "o", "", "also write the trace to this file")
	f.StringVar(&withPrefetches, "with-prefetches", "", "replay the trace's prefetch requests too (a recorded trace): all of them (the flag alone: every guess into the level, as --prefetch-to vram would), or vram or ram: those the run sent to that level (the GPU pager's sure guesses into VRAM) and those whose level the trace does not say; loads counts misses and prefetches, as the pager's uploads; Belady's MIN still replays demands only")
	f.Lookup("with-prefetches").NoOptDefVal = "all"
	return cmd
}

// tiersStatsCmd promotes every expert of a stored model from disk to RAM
// (the disk and RAM levels under their budgets) and prints the cache's
// statistics: a measured run of the levels this machine has.
func tiersStatsCmd(a *app) *cobra.Command {
	var budgets [3]byteSize
	var policy string
	var rounds int
	cmd := &cobra.Command{
		Use:   "stats <model CID>",
		Short: "Read every expert of a stored model through the disk and RAM levels and print per-level statistics",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cas.ParseCID(args[0])
			if err != nil {
				return err
			}
			return a.withStore(func(st *cas.Store) error {
				m, err := experts.LoadManifest(st, c)
				if err != nil {
					return err
				}
				b := tiers.Clamp(tiers.Budgets{VRAM: int64(budgets[0]), RAM: int64(budgets[1]), Disk: int64(budgets[2])}, st.Dir(), 0, a.log)
				cache, err := tiers.New(tiers.Config{RAM: b.RAM, Disk: tiers.DiskSource{Store: st}, Policy: policy, Logger: a.log})
				if err != nil {
					return err
				}
				defer cache.Close()
				t0 := time.Now()
				var bytes int64
				for r := 0; r < rounds; r++ {
					for _, e := range m.Experts {
						for _, rg := range m.Ranges(e.Shard, e.Offset, e.Size) {
							s := m.Shards[rg.Shard]
							l, err := cache.Get(context.Background(), tiers.Key{Blob: s.CID(), Size: s.Size, Off: rg.Offset, Len: rg.Size}, tiers.RAM)
							if err != nil {
								return err
							}
							bytes += rg.Size
							l.Release()
						}
					}
				}
				secs := time.Since(t0).Seconds()
				stats := cache.Stats()
				return a.print(map[string]any{"seconds": secs, "bytes": bytes, "levels": stats}, func(w io.Writer) {
					fmt.Fprintf(w, "%d experts x %d rounds, %s in %.2f s\n", len(m.Experts), rounds, formatBytes(bytes), secs)
					fmt.Fprintf(w, "%-6s %8s %8s %8s %10s %10s\n", "level", "hits", "misses", "hit rate", "bytes up", "evictions")
					for _, s := range stats {
						fmt.Fprintf(w, "%-6s %8d %8d %8.3f %10s %10d\n", s.Level, s.Hits, s.Misses, s.HitRate, formatBytes(s.BytesUp), s.Evictions)
					}
				})
			})
		},
	}
	budgetFlags(cmd, &budgets)
	cmd.Flags().StringVar(&policy, "policy", "cycle", "eviction policy: lru, lfu, cost (GreedyDual-Size-Frequency), cycle (learns the layer cycle) or forecast (needs the pager's layers and tokens: LRU here; tiers/BENCHMARKS.md)")
	cmd.Flags().IntVar(&rounds, "rounds", 2, "passes over the experts")
	return cmd
}
