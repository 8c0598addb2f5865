package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/experts"
	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/kernels"
	"github.com/rdrr/peer/kernels/lab"
	"github.com/rdrr/peer/swarm"
	"github.com/rdrr/peer/tiers"
	"github.com/spf13/cobra"
)

func generateCmd(a *app) *cobra.Command {
	var warm, profileGPU, profileSubmits, special bool
	var prompt, tracePath, cpuProfile, goTrace, policy, engine, procedural, activations string
	var maxTokens int
	var prefetch bool
	hostRAM := autoBool{auto: true}
	var prefetchTo string
	var prefetchSure float64
	var s experts.Sampling
	var budgets [3]byteSize
	var nf netFlags
	cmd := &cobra.Command{
		Use:   "generate <model CID> --prompt TEXT [--max-tokens N] [--temperature T --top-p P --seed S] [--engine gpu --vram SIZE] [--ram SIZE] [--signal URL]",
		Short: "Generate with a model, its experts paged through the VRAM, RAM, disk and swarm levels (GPU engine, or a float64 CPU reference)",
		Long: `generate runs the model's decode loop: dense weights are read once and
kept, experts are paged through the tiers cache (VRAM under --vram with
--engine gpu, RAM under --ram, then this peer's store, then, with --signal,
any peer of the swarm that holds the shard: one verified range per expert).
--engine gpu runs it on wgpu kernels; the default engine is the float64 CPU
reference that checks it. A model converted from GGUF encodes the prompt and
decodes its tokens with its own tokenizer (SentencePiece for llama,
byte-level BPE for gpt2; experts.TokenCodec); synthetic models use bytes as
tokens. --profile-gpu times every dispatch on the GPU.

Without --vram the GPU engine's experts take 90% of a discrete GPU's
memory (of what other processes leave, where the driver says) less the
dense weights, the KV cache and 2 GiB (all the experts if
that holds them; the GPU's memory asked of the Vulkan loader; 8 GiB where
it cannot tell, or the adapter is a CPU or an integrated GPU, whose memory
is the machine's). Without --ram the GPU engine's RAM level takes half of
the memory the machine has available, at most every expert (8 GiB where
it cannot tell, and for the reference engine, whose dense weights are
float64 outside it). The log says what was chosen (--log-level info).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if activations != "" && (engine != "gpu" || !slices.Contains(experts.ActivationModes, activations)) {
				return fmt.Errorf("generate: --activations %q: one of %s, with --engine gpu", activations, strings.Join(experts.ActivationModes, ", "))
			}
			prefetchLevel := tiers.VRAM
			switch prefetchTo {
			case "vram":
			case "ram":
				prefetchLevel = tiers.RAM
			default:
				return fmt.Errorf("--prefetch-to %q: want ram or vram", prefetchTo)
			}
			if !(prefetchSure >= 0 && prefetchSure <= 1) {
				return fmt.Errorf("--prefetch-sure %v: want a rate from 0 (never) to 1", prefetchSure)
			}
			if policy == "" {
				// The GPU pager tells the cache each matrix's layer and each
				// step's token, which forecast learns from (tiers/BENCHMARKS.md).
				policy = "cycle"
				if engine == "gpu" {
					policy = "forecast"
				}
			}
			if _, err := tiers.NewPolicy(policy); err != nil {
				return fmt.Errorf("--policy: %w", err) // before the model loads
			}
			var ps *experts.ProceduralSource
			if procedural != "" {
				mb, err := os.ReadFile(procedural)
				if err != nil {
					return err
				}
				if ps, err = experts.NewProceduralSource(mb); err != nil {
					return err
				}
				if args[0] != ps.CID().String() && args[0] != "-" {
					return fmt.Errorf("generate: %s is the model of %s, not %s (or give -)", ps.CID(), procedural, args[0])
				}
				args[0] = ps.CID().String()
			}
			c, err := cas.ParseCID(args[0])
			if err != nil {
				return err
			}
			return a.withStore(func(st *cas.Store) error {
				var fetcher tiers.SliceFetcher
				var remote *experts.Manifest
				if nf.signal != "" {
					id, _, err := swarm.InitIdentity(a.home)
					if err != nil {
						return err
					}
					m, err := a.startMember(ctx, cmd, &nf, id, st)
					if err != nil {
						return err
					}
					defer m.Close()
					fetcher = &swarm.Ranges{Node: m.Node(), Discover: m.Discover}
					if !st.Has(c) {
						// Only the manifest comes from the swarm; the shards
						// are paged by range.
						if remote, err = fetchManifest(ctx, c, fetcher.(*swarm.Ranges)); err != nil {
							return err
						}
					}
				}
				m := remote
				if ps != nil {
					m = ps.Manifest()
				}
				if m == nil {
					if m, err = experts.LoadManifest(st, c); err != nil {
						return err
					}
				}
				codec, promptToks, err := promptTokens(m, prompt, special)
				if err != nil {
					return err
				}
				if codec != nil && codec.Warning() != "" {
					a.log.Warn("generate: " + codec.Warning())
				}
				// The reference engine keeps its dense weights as float64
				// outside the cache (Mixtral's: ~13 GB): its RAM budget
				// stays the flag's.
				if !cmd.Flags().Changed("ram") && engine == "gpu" {
					budgets[1] = byteSize(autoRAM(m, tiers.MemAvailable()))
					a.log.Info("generate: RAM budget (half of the memory available, at most the experts; --ram sets it)", "ram", formatBytes(int64(budgets[1])))
				}
				b := tiers.Clamp(tiers.Budgets{RAM: int64(budgets[1])}, "", 0, a.log)
				rec := &tiers.TraceRecorder{}
				cfg := tiers.Config{RAM: b.RAM, Disk: tiers.DiskSource{Store: st}, Policy: policy, Trace: rec, Logger: a.log, HostRAM: hostRAM.on}
				if fetcher != nil {
					// At most 16 slices in flight: a peer refuses more than
					// 32 outstanding requests, and the GPU engine pages a
					// layer's matrices (and prefetches) all at once.
					cfg.Swarm = tiers.SwarmSource{Fetcher: tiers.LimitFetcher(fetcher, 16)}
				}
				if ps != nil {
					cfg.Disk = ps // regenerated on demand: nothing stored
				}
				t0 := time.Now()
				var step stepper
				var closeEngine func()
				if engine == "gpu" {
					step, closeEngine, err = a.gpuEngine(ctx, st, m, &cfg, hostRAM.auto, int64(budgets[0]), !cmd.Flags().Changed("vram"), len(promptToks)+maxTokens, prefetch, prefetchLevel, prefetchSure, profileGPU, profileSubmits, activations)
					if err != nil {
						return err
					}
				}
				var cache *tiers.Cache
				var rm *experts.RefModel
				if step == nil {
					if cache, err = tiers.New(cfg); err != nil {
						return err
					}
					defer cache.Close()
					if rm, err = experts.NewRefModel(ctx, m, cache); err != nil {
						return err
					}
					rm.Trace = rec
				} else {
					defer closeEngine()
					cache = step.Cache()
				}
				load := time.Since(t0)
				var warmed []tiers.LevelStats
				var busy warmBusied
				if warm {
					if step == nil {
						return errors.New("generate: --warm needs --engine gpu")
					}
					if warmed, busy, err = warmUp(ctx, a, step, cache); err != nil {
						return err
					}
				}
				if cpuProfile != "" {
					if os.Getenv(envCPUProfile) != "" {
						return fmt.Errorf("generate: --cpuprofile and %s both ask for a CPU profile (the process's covers the generation): use one", envCPUProfile)
					}
					stop, err := profileCPU(cpuProfile)
					if err != nil {
						return err
					}
					defer stop()
				}
				if goTrace != "" {
					stop, err := traceGo(goTrace)
					if err != nil {
						return err
					}
					defer stop()
				}
				gpuProfile := false
				if profileSubmits && step != nil {
					if err := step.StartGPUProfile(true); err != nil {
						a.log.Warn("generate: --profile-submits: no GPU timestamps", "err", err)
					} else {
						gpuProfile = true
					}
				} else if profileGPU && step != nil {
					if err := step.StartGPUProfile(false); err != nil {
						a.log.Warn("generate: --profile-gpu: no GPU timestamps; timing each part of a layer by waiting for it instead", "err", err)
					} else {
						gpuProfile = true
					}
				}
				// The device's dispatches and barriers over the generation
				// (gpu's model of where wgpu places barriers: a dispatch
				// without one runs beside the one before it).
				var dev0 gpu.Stats
				ds, hasDev := step.(interface{ DeviceStats() gpu.Stats })
				if hasDev {
					dev0 = ds.DeviceStats()
				}
				t1 := time.Now()
				gen := func(p []int, n int, s experts.Sampling, emit func(int)) ([]int, error) {
					if rm != nil {
						return rm.Generate(ctx, p, n, s, emit)
					}
					return step.Generate(ctx, p, n, s, emit)
				}
				// The generated text: the tokenizer's, a character held back
				// until its last byte comes; a synthetic model's bytes.
				var text strings.Builder
				var dec *experts.TokenDecoder
				if codec != nil {
					dec = codec.NewDecoder()
				}
				show := func(s string) {
					text.WriteString(s)
					if !a.jsonOut {
						fmt.Fprint(a.out, s)
					}
				}
				toks, err := gen(promptToks, maxTokens, s, func(t int) {
					if dec != nil {
						show(dec.Next(t))
					} else {
						show(experts.TokenText(t))
					}
				})
				if dec != nil {
					show(dec.Flush())
				}
				if err != nil {
					return err
				}
				secs := time.Since(t1).Seconds()
				var dispatches, barriers uint64
				if hasDev {
					dev1 := ds.DeviceStats()
					dispatches, barriers = dev1.Dispatches-dev0.Dispatches, dev1.Barriers-dev0.Barriers
				}
				var gp *gpu.Profile
				if gpuProfile {
					p, err := step.StopGPUProfile(ctx)
					if err != nil {
						return err
					}
					gp = &p
				}
				tr := rec.Trace()
				if tracePath != "" {
					f, err := os.Create(tracePath)
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
				stats := cache.Stats()
				if warmed != nil {
					for i := range stats {
						stats[i] = stats[i].Since(warmed[i])
					}
				}
				engineName := "ref-cpu-float64"
				if step != nil {
					engineName = "gpu"
				}
				var predicted, correct int
				var prof *experts.StepProfile
				if step != nil {
					predicted, correct = step.Prefetched()
					prof = step.Profile()
				}
				res := map[string]any{"model": m.ModelID, "engine": engineName, "tokens": toks, "text": text.String(),
					"prefetchPredicted": predicted, "prefetchCorrect": correct,
					"promptTokens": len(promptToks), "seconds": secs, "tokPerSec": float64(len(promptToks)+len(toks)) / secs,
					"loadSeconds": load.Seconds(), "levels": stats, "hostRAM": cfg.HostRAM}
				if busy.copies > 0 {
					res["warmBusySeconds"], res["warmBusyCopies"] = busy.seconds, busy.copies
				}
				if prof != nil {
					res["profile"] = prof
					res["stallSeconds"] = prof.PageWait.Seconds()
				}
				// The steady state: the median interval between the starts of
				// generated steps (the run's tok/s also counts its first
				// steps, slow after an idle GPU, and the prompt's).
				var median time.Duration
				var medianOf int
				if s, ok := step.(interface{ StepMedian() (time.Duration, int) }); ok {
					if median, medianOf = s.StepMedian(); medianOf > 0 {
						res["stepMedianNs"], res["stepMedianOf"] = median, medianOf
					}
				}
				if dispatches > 0 {
					res["dispatches"], res["barriers"] = dispatches, barriers
				}
				var ab *experts.ABResult
				if s, ok := step.(interface {
					AB() (experts.ABResult, bool)
				}); ok {
					if r, ok := s.AB(); ok {
						ab = &r
						res["ab"] = r
					}
				}
				// Belady's MIN on this run's demands at the VRAM level's
				// budget (what `peer tiers simulate` gives on the --trace
				// file): the hit rate no eviction policy can beat without
				// prefetching, where the budget does not hold every matrix
				// the run used (experts were paged). Only the experts'
				// accesses: the dense tensors, read once through the cache
				// at load, never go to the VRAM level (until 2026-11-30 they
				// counted as misses of MIN's, 1.2% of a Mixtral run of 100
				// tokens).
				var belady *tiers.SimResult // nil: no MIN to report
				vram := stats[tiers.VRAM]
				if ex := tr.Grouped(); vram.Budget > 0 && vram.Hits+vram.Misses > 0 && vram.Budget < ex.Bytes() {
					if r := tiers.Belady(ex, vram.Budget); r.HitRate > 0 {
						belady = &r
						res["belady"] = map[string]any{"budget": r.Budget, "hitRate": r.HitRate, "ofMin": vram.HitRate / r.HitRate}
					}
				}
				var leads []experts.GuessCount
				if ls, ok := step.(interface{ Leads() []experts.GuessCount }); ok && predicted > 0 {
					leads = ls.Leads()
					var byLead []map[string]any
					for i, c := range leads {
						b := map[string]any{"guesses": c.Guesses, "right": c.Right, "sure": c.Sure}
						if i < len(experts.GuessLeads) {
							b["below"] = experts.GuessLeads[i]
						}
						byLead = append(byLead, b)
					}
					res["prefetchByLead"] = byLead
				}
				if act, ok := step.(interface{ Activations() string }); ok {
					res["activations"] = act.Activations()
					engineName += ", " + act.Activations() + " activations"
				}
				var gpuTimes map[string]time.Duration
				if step != nil {
					gpuTimes = step.GPUTimes()
				}
				if len(gpuTimes) > 0 {
					res["gpuTimesNs"] = gpuTimes
				}
				if gp != nil {
					res["gpuProfile"] = gp
				}
				return a.print(res, func(w io.Writer) {
					fmt.Fprintf(w, "\n%d prompt + %d generated tokens in %.2f s: %.1f tok/s (engine %s; dense weights loaded in %.2f s)\n",
						len(promptToks), len(toks), secs, float64(len(promptToks)+len(toks))/secs, engineName, load.Seconds())
					if medianOf > 0 {
						fmt.Fprintf(w, "  median step %s (of %d generated: %.1f tok/s steady)\n", median.Round(time.Microsecond), medianOf, 1/median.Seconds())
					}
					if cfg.HostRAM {
						fmt.Fprintf(w, "  RAM level in pinned host memory the GPU copies from (--host-ram %s)\n", hostRAM.String())
					}
					if predicted > 0 {
						fmt.Fprintf(w, "  next-layer prefetch: %d of %d guesses right (%.2f)\n", correct, predicted, float64(correct)/float64(predicted))
						if len(leads) > 0 {
							fmt.Fprintf(w, "    by the guess's lead over the experts not guessed (router scores):")
							for i, c := range leads {
								if c.Guesses == 0 {
									continue
								}
								if i < len(experts.GuessLeads) {
									fmt.Fprintf(w, " <%g", experts.GuessLeads[i])
								} else {
									fmt.Fprintf(w, " >=%g", experts.GuessLeads[i-1])
								}
								fmt.Fprintf(w, " %d/%d", c.Right, c.Guesses)
								if c.Sure > 0 {
									fmt.Fprintf(w, " (%d sure)", c.Sure)
								}
							}
							fmt.Fprintln(w)
						}
					}
					if len(gpuTimes) > 0 && prof != nil && prof.Steps > 0 {
						fmt.Fprintf(w, "  GPU time per step (--profile-gpu):")
						for _, k := range []string{"embed", "attention", "router", "experts", "head"} {
							fmt.Fprintf(w, " %s %s", k, (gpuTimes[k] / time.Duration(prof.Steps)).Round(time.Microsecond))
						}
						fmt.Fprintln(w)
					}
					if gp != nil && prof != nil && prof.Steps > 0 {
						printGPUProfile(w, gp, prof.Steps)
					}
					if prof != nil && prof.Steps > 0 {
						per := func(d time.Duration) string { return (d / time.Duration(prof.Steps)).Round(time.Microsecond).String() }
						fmt.Fprintf(w, "  per step: %s = record+submit %s (%s of it ahead), router read-back %s, paging stall %s, logits read-back %s (%.3g submits, %.3g read-backs per step)\n",
							per(prof.Total), per(prof.Record), per(prof.Ahead), per(prof.RouteWait), per(prof.PageWait), per(prof.LogitsWait), float64(prof.Submits)/float64(prof.Steps), float64(prof.Readbacks)/float64(prof.Steps))
						if dispatches > 0 {
							fmt.Fprintf(w, "  dispatches per step: %d, %d of them after a barrier (the others run beside the one before)\n",
								dispatches/uint64(prof.Steps), barriers/uint64(prof.Steps))
						}
						if ab != nil {
							ratio := "-"
							if ab.Off.Median > 0 {
								ratio = fmt.Sprintf("%.3f", float64(ab.On.Median)/float64(ab.Off.Median))
							}
							fmt.Fprintf(w, "  A/B inside the step (RDRR_GPU_AB=%s, alternated every %d steps): on %s a step (median of %d), off %s (of %d); on/off %s\n",
								ab.Toggle, ab.Period, ab.On.Median.Round(time.Microsecond), ab.On.Steps, ab.Off.Median.Round(time.Microsecond), ab.Off.Steps, ratio)
						}
						if prof.Turns > 0 {
							avg := func(d time.Duration, n int) string {
								return (d / time.Duration(max(n, 1))).Round(time.Microsecond).String()
							}
							fmt.Fprintf(w, "  host's turn after a paged layer's choice: %s a layer over %d layers a step (%s over the %d with every chosen expert resident, %s over the others, their first copy submitted %s into it); %d layers a step encoded early\n",
								avg(prof.Turn, prof.Turns), prof.Turns/prof.Steps, avg(prof.TurnHit, prof.TurnsHit), prof.TurnsHit/prof.Steps, avg(prof.Turn-prof.TurnHit, prof.Turns-prof.TurnsHit), avg(prof.FirstCopy, prof.Turns-prof.TurnsHit), prof.Early/prof.Steps)
						}
					}
					for _, s := range stats {
						if s.Hits+s.Misses > 0 {
							fmt.Fprintf(w, "  %-6s hits %d, misses %d (hit rate %.2f), %s up, %d evictions\n", s.Level, s.Hits, s.Misses, s.HitRate, formatBytes(s.BytesUp), s.Evictions)
						}
					}
					if belady != nil {
						fmt.Fprintf(w, "  Belady's MIN on this run's demands at the VRAM budget (%s): hit rate %.3f; this run %.3f, %.2f of it (sure prefetches count as hits here, not in MIN)\n",
							formatBytes(belady.Budget), belady.HitRate, vram.HitRate, vram.HitRate/belady.HitRate)
					}
				})
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&prompt, "prompt", "Hello", "the prompt")
	f.BoolVar(&special, "special", false, "the prompt spells out the model's special tokens, as a chat template's text does (\"<|user|>\\nHi<|end|>\\n\"): their text becomes those tokens, and the whitespace the model's rules strip next to them goes (llama.cpp's parse_special); without it such text is plain text")
	f.IntVar(&maxTokens, "max-tokens", 32, "tokens to generate")
	f.Float64Var(&s.Temperature, "temperature", 0, "sampling temperature (0: greedy)")
	f.Float64Var(&s.TopP, "top-p", 1, "nucleus sampling mass")
	f.Uint64Var(&s.Seed, "seed", 1, "sampling seed")
	f.StringVar(&policy, "policy", "", "eviction policy: lru, lfu, cost (GreedyDual-Size-Frequency), cycle (learns the layer cycle) or forecast (learns each layer's experts from recency and the step's token); default forecast with --engine gpu, else cycle (tiers/BENCHMARKS.md)")
	f.BoolVar(&warm, "warm", false, "gpu engine: before timing, load every expert into RAM, and into VRAM when --vram holds them all (the stats are then those of the timed run), then keep the GPU busy a second (an idle GPU's clocks take up to ~0.6 s of work to rise)")
	f.BoolVar(&profileSubmits, "profile-submits", false, "gpu engine: time each submission on the GPU as a whole (two empty timed passes each) and print the GPU's idle time between them and what ended each wait, with little of --profile-gpu's cost to the host")
	f.BoolVar(&profileGPU, "profile-gpu", false, "gpu engine: time every dispatch on the GPU (timestamp queries, each dispatch in a pass of its own) and print where the steps' GPU time goes; without timestamps, wait for the GPU after each part of a resident layer instead (much slower)")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a Go CPU profile of the generation (not the load) here")
	f.StringVar(&goTrace, "go-trace", "", "write a Go execution trace of the generation (not the load) here (go tool trace: where the host waits, goroutine wake-ups)")
	f.StringVar(&tracePath, "trace", "", "write the expert access trace here (tiers/TRACE.md)")
	f.StringVar(&engine, "engine", "ref", "decode engine: ref (float64 CPU reference) or gpu (wgpu kernels, experts paged into a VRAM arena of --vram bytes)")
	f.Var(&hostRAM, "host-ram", "gpu engine: keep the RAM level's experts in pinned host memory the GPU copies from directly, so that an upload is one DMA copy with no memcpy into staging: auto (on when --vram does not hold every expert, so that experts are paged), true or false. Pinned memory slows the GPU's own work (on the H100 a resident Mixtral step 7.8 -> 9.5 ms with 24 GiB pinned) but paging faster (16 -> 21 tok/s at 25% in VRAM): tiers/BENCHMARKS.md")
	f.Lookup("host-ram").NoOptDefVal = "true"
	f.StringVar(&activations, "activations", "", "gpu engine: what the layers' Q4_K products read: q8 (the default: every product's x quantized to 8 bits in groups of 16, two weights a 32-bit integer multiply-add, as llama.cpp's CUDA path quantizes in groups of 32), q8-experts (the experts' x only, q k v's and o's float: 3.6% slower, and nearer the float model where a router's margin is small) or f32 (float x: the exact arithmetic, which the float64 reference matches within 1e-3; RDRR_GPU_XQ=0 makes it the default, =experts q8-experts)")
	f.BoolVar(&prefetch, "prefetch", true, "gpu engine: prefetch each next layer's likely experts (its router on the current hidden state)")
	f.Float64Var(&prefetchSure, "prefetch-sure", 0.85, "gpu engine, with --prefetch-to ram: prefetch a guessed expert into VRAM instead when it is sure: in this run, the guesses that led the experts not guessed by as much (its bucket of router-score leads, counted 32 times or more) were right at least this often; 0: never")
	f.StringVar(&prefetchTo, "prefetch-to", "ram", "gpu engine: the level prefetches promote to: vram (through ram: fetched and uploaded) or ram (fetched from disk or the swarm only; the GPU's queue stays the demand's)")
	f.StringVar(&procedural, "procedural", "", "the manifest of a synthetic model to regenerate locally instead of reading a store (model argument: its CID or -)")
	budgetFlags(cmd, &budgets)
	nf.add(cmd)
	return cmd
}

// promptTokens encodes the prompt with the model's tokenizer, or as bytes
// for a model without one (synthetic: ids 0-255 are the bytes, so its
// vocabulary must hold 256). The codec is nil for bytes. With special,
// the text of the model's control tokens becomes those tokens
// (TokenCodec.EncodeSpecial).
func promptTokens(m *experts.Manifest, prompt string, special bool) (*experts.TokenCodec, []int, error) {
	var codec *experts.TokenCodec
	var toks []int
	if m.Tokenizer != nil {
		var err error
		if codec, err = experts.NewTokenCodec(m.Tokenizer); err != nil {
			return nil, nil, fmt.Errorf("generate: %w", err)
		}
		encode := codec.Encode
		if special {
			encode = codec.EncodeSpecial
		}
		if toks, err = encode(prompt); err != nil {
			return nil, nil, fmt.Errorf("generate: the prompt: %w", err)
		}
	} else {
		if m.Config.VocabSize < 256 {
			return nil, nil, fmt.Errorf("generate: this model has no tokenizer and a vocabulary of %d, too small for bytes as tokens", m.Config.VocabSize)
		}
		if len(prompt) > experts.MaxPromptBytes {
			return nil, nil, fmt.Errorf("generate: the prompt: %w: %d bytes (the limit is %d)", experts.ErrPromptTooLong, len(prompt), experts.MaxPromptBytes)
		}
		toks = experts.ByteTokens(prompt)
	}
	if len(toks) == 0 {
		return nil, nil, errors.New("generate: the prompt has no tokens (give some text)")
	}
	for _, t := range toks {
		if t >= m.Config.VocabSize {
			return nil, nil, fmt.Errorf("generate: the prompt's token %d is outside the model's vocabulary of %d", t, m.Config.VocabSize)
		}
	}
	return codec, toks, nil
}

// fetchManifest fetches a model's collection blob and its manifest (not
// the shards, which are paged by range), each verified, and checks that
// the manifest is the collection's.
func fetchManifest(ctx context.Context, c cas.CID, r *swarm.Ranges) (*experts.Manifest, error) {
	if !c.IsCollection() {
		return nil, fmt.Errorf("%s: a model is named by its collection CID (bagaybqab...)", c)
	}
	cb, err := r.FetchBlob(ctx, c, cas.MaxCollectionSize)
	if err != nil {
		return nil, err
	}
	col, err := cas.ParseCollection(cb)
	if err != nil {
		return nil, err
	}
	mb, err := r.FetchBlob(ctx, col.Shards[0].CID, experts.MaxManifestBytes)
	if err != nil {
		return nil, err
	}
	m, err := experts.Decode(mb)
	if err != nil {
		return nil, err
	}
	if experts.ModelCID(mb, m) != c {
		return nil, fmt.Errorf("%s: the manifest's shards are not the collection's (%w)", c, experts.ErrNotModel)
	}
	return m, nil
}

// stepper is a decode engine other than the reference.
type stepper interface {
	Cache() *tiers.Cache
	Prefetched() (predicted, correct int)
	Profile() *experts.StepProfile
	ExpertKeys() []tiers.Key
	GPUTimes() map[string]time.Duration
	StartGPUProfile(submits bool) error
	StopGPUProfile(ctx context.Context) (gpu.Profile, error)
	Generate(ctx context.Context, prompt []int, n int, s experts.Sampling, emit func(int)) ([]int, error)
}

// gpuEngine opens the GPU and makes a GPU model whose experts are paged
// into an arena of vram bytes (its slots one expert each).
// With autoHostRAM, cfg.HostRAM is set when the arena does not hold every
// expert matrix (experts are paged: their uploads from pinned host memory
// are one DMA copy each), and cleared when it does (nothing is paged, and
// pinned memory only slows the GPU's work).
//
// activations, if not empty, is SetActivations's choice.
func (a *app) gpuEngine(ctx context.Context, st *cas.Store, m *experts.Manifest, cfg *tiers.Config, autoHostRAM bool, vram int64, autoVRAMBudget bool, maxPos int, prefetch bool, prefetchTo tiers.Level, prefetchSure float64, profileGPU, profileSubmits bool, activations string) (stepper, func(), error) {
	// The arena is one buffer and one storage binding: ask the device for
	// buffers as large as the VRAM budget, within the 2 GiB that wgpu
	// binds (larger budgets degrade, with a warning, in NewGPUArena).
	maxBuf := uint64(min(max(vram, 256<<20), 2<<30-4))
	d, err := gpu.Open(ctx, gpu.Options{Logger: a.log, MaxBufferSize: maxBuf, MaxStorageBinding: maxBuf, Profile: profileGPU || profileSubmits})
	if err != nil {
		d, err = gpu.Open(ctx, gpu.Options{Logger: a.log, Profile: profileGPU || profileSubmits}) // the adapter offers less
	}
	if err != nil {
		return nil, nil, fmt.Errorf("generate: no GPU (try --engine ref): %w", err)
	}
	used, err := a.activeKernels(ctx, d, st)
	if err != nil {
		a.log.Warn("generate: some active kernel variants were not used (built-ins run instead)", "err", err)
	} else if len(used) > 0 {
		a.log.Info("generate: kernel variants active", "ops", used)
	}
	if autoVRAMBudget {
		// Only a discrete GPU's own memory is counted: a CPU adapter's or
		// an integrated GPU's "VRAM" is the machine's memory, which the
		// RAM level budgets too, so the flag's default stands there, as
		// where the GPU's memory is not known, but never more than the
		// experts take.
		perBank := tiers.SlotsPerBuffer(d, max(experts.ExpertMatrixBytes(m), 1))
		var heap, free uint64
		if d.Info().Type == "discrete-gpu" {
			heap, free = d.LocalMemory()
		}
		if v, ok := autoVRAM(m, heap, free, maxPos, perBank); ok {
			vram = v
			a.log.Info("generate: VRAM budget (90% of the GPU's memory free to this process less the dense weights, the KV cache and 2 GiB; at most the experts; --vram sets it)",
				"vram", formatBytes(vram), "gpu_memory", formatBytes(int64(heap)), "free", formatBytes(int64(free)))
		} else {
			all, least := arenaBytes(m, perBank)
			vram = min(vram, max(all, least))
			a.log.Info("generate: VRAM budget (not a discrete GPU, or its memory not known: 8 GiB, at most the experts; --vram sets it)", "vram", formatBytes(vram), "adapter", d.Info().Type)
		}
	}
	esize := experts.ExpertMatrixBytes(m)
	slots := int(vram / max(esize, 1))
	if slots < 3*m.Config.NumExpertsPerTok {
		d.Close()
		return nil, nil, fmt.Errorf("generate: --vram %s holds %d expert matrices of %s; a layer needs %d", formatBytes(vram), slots, formatBytes(esize), 3*m.Config.NumExpertsPerTok)
	}
	arena, err := tiers.NewGPUArena(d, esize, slots, a.log)
	if err != nil {
		d.Close()
		return nil, nil, err
	}
	cfg.Arena = arena
	if autoHostRAM {
		cfg.HostRAM = arena.Slots() < experts.ExpertMatrices(m)
	}
	cache, err := tiers.New(*cfg)
	if err != nil {
		arena.Release()
		d.Close()
		return nil, nil, err
	}
	g, err := experts.NewGPUModel(ctx, m, d, cache, arena, maxPos)
	if err != nil {
		cache.Close()
		arena.Release()
		d.Close()
		return nil, nil, err
	}
	if activations != "" {
		if err = g.SetActivations(ctx, activations); err != nil {
			g.Close()
			cache.Close()
			arena.Release()
			d.Close()
			return nil, nil, fmt.Errorf("generate: --activations: %w", err)
		}
	}
	if g.Activations() != "f32" {
		// A variant stands in for a built-in of the same bindings: the
		// products of quantized x (their x a word array) have none.
		for op := range used {
			if strings.HasPrefix(op, "q4k") {
				a.log.Info("generate: with quantized activations the expert products (and with q8 q k v and o) run kernels of quantized x, which no variant replaces; this variant runs for the others (--activations f32: everywhere)", "op", op)
			}
		}
	}
	if cfg.HostRAM {
		cache.ForVRAM(g.ExpertKeys()) // a --warm of RAM makes them in host memory too
	}
	g.Trace = cfg.Trace
	g.Prefetch, g.PrefetchTo, g.PrefetchSure = prefetch, prefetchTo, prefetchSure
	// With timestamps the dispatches are timed as they run; without, each
	// part of a layer is waited for (GPUModel.ProfileGPU).
	g.ProfileGPU = profileGPU && !profileSubmits && !d.Info().TimestampQuery
	return gpuStepper{g, cache, d}, func() { g.Close(); cache.Close(); arena.Release(); d.Close() }, nil
}

type gpuStepper struct {
	g     *experts.GPUModel
	cache *tiers.Cache
	d     *gpu.Device
}

func (s gpuStepper) StartGPUProfile(submits bool) error {
	if submits {
		return s.d.StartSubmitProfile()
	}
	return s.d.StartProfile()
}
func (s gpuStepper) StopGPUProfile(ctx context.Context) (gpu.Profile, error) {
	return s.d.StopProfile(ctx)
}

func (s gpuStepper) Cache() *tiers.Cache                  { return s.cache }
func (s gpuStepper) Activations() string                  { return s.g.Activations() }
func (s gpuStepper) Prefetched() (predicted, correct int) { return s.g.Predicted, s.g.Correct }
func (s gpuStepper) Leads() []experts.GuessCount          { return s.g.Leads[:] }
func (s gpuStepper) Profile() *experts.StepProfile        { return &s.g.Profile }

// AB returns the A/B's result and stops it, its toggle set back (so that
// what the output says of the model, its activations, is its setting).
func (s gpuStepper) AB() (experts.ABResult, bool) {
	r, ok := s.g.AB()
	if ok {
		s.g.SetAB("")
	}
	return r, ok
}
func (s gpuStepper) StepMedian() (time.Duration, int) { return s.g.StepMedian() }
func (s gpuStepper) Busy(ctx context.Context, d time.Duration) (int, error) {
	return s.g.Busy(ctx, d)
}
func (s gpuStepper) DeviceStats() gpu.Stats             { return s.d.Stats() }
func (s gpuStepper) ExpertKeys() []tiers.Key            { return s.g.ExpertKeys() }
func (s gpuStepper) GPUTimes() map[string]time.Duration { return s.g.GPUTimes }
func (s gpuStepper) Generate(ctx context.Context, prompt []int, n int, smp experts.Sampling, emit func(int)) ([]int, error) {
	return s.g.Generate(ctx, prompt, n, smp, emit)
}

// warmBusied is how long --warm kept the GPU busy last, and the copies
// that took.
type warmBusied struct {
	seconds float64
	copies  int
}

// warmUp loads every expert matrix into RAM, and into VRAM when the
// arena holds them all, then keeps the GPU busy warmBusy, logging what it
// did, and returns the stats at its end (what the timed run's are
// measured from).
func warmUp(ctx context.Context, a *app, step stepper, cache *tiers.Cache) ([]tiers.LevelStats, warmBusied, error) {
	keys := step.ExpertKeys()
	var total int64
	for _, k := range keys {
		total += k.Len
	}
	workers := max(2, runtime.NumCPU())
	levels := cache.Stats()
	for _, lv := range []tiers.Level{tiers.RAM, tiers.VRAM} {
		if levels[lv].Budget < total {
			a.log.Warn("generate: --warm: the experts do not all fit; this level starts cold", "level", lv, "experts", formatBytes(total), "budget", formatBytes(levels[lv].Budget))
			continue
		}
		t := time.Now()
		last := time.Now()
		var mu sync.Mutex
		err := cache.Warm(ctx, keys, lv, workers, func(done, n int) {
			mu.Lock()
			defer mu.Unlock()
			if time.Since(last) > 5*time.Second {
				last = time.Now()
				a.log.Info("generate: warming", "level", lv, "done", done, "of", n)
			}
		})
		if err != nil {
			return nil, warmBusied{}, err
		}
		sec := time.Since(t).Seconds()
		a.log.Info("generate: warm", "level", lv, "matrices", len(keys), "bytes", formatBytes(total), "seconds", sec, "GBps", float64(total)/sec/1e9)
	}
	// The GPU too: a warm that read the experts from disk left it idle
	// for seconds, and an idle GPU's clocks take up to ~0.6 s of work to
	// rise.
	var busy warmBusied
	if b, ok := step.(interface {
		Busy(context.Context, time.Duration) (int, error)
	}); ok {
		t := time.Now()
		n, err := b.Busy(ctx, warmBusy)
		switch {
		case ctx.Err() != nil:
			return nil, warmBusied{}, ctx.Err()
		case err != nil:
			// A nicety: the run goes on, its first steps maybe slower.
			a.log.Warn("generate: warm: keeping the GPU busy failed", "err", err)
		default:
			busy = warmBusied{time.Since(t).Seconds(), n}
			a.log.Info("generate: warm: GPU kept busy", "seconds", busy.seconds, "copies", n)
		}
	}
	return cache.Stats(), busy, nil
}

// warmBusy is how long --warm keeps the GPU busy last: on the H200 its
// clocks rose from 345-375 to 1980 MHz 200 to 580 ms after work began on
// a GPU left idle (experts/BENCHMARKS.md, 2026-11-29).
const warmBusy = time.Second

// activeKernels puts the kernel variants this home activated (`peer kernels
// pull` or `use`) in place of their built-ins on d, before the model's
// kernels compile. A home without a kernel registry runs the built-ins.
func (a *app) activeKernels(ctx context.Context, d *gpu.Device, st *cas.Store) (map[string]string, error) {
	dir := filepath.Join(a.home, "kernels")
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	reg, err := kernels.OpenRegistry(dir, nil)
	if err != nil {
		return nil, err
	}
	defer reg.Close()
	return lab.Activate(ctx, d, reg, st)
}

// printGPUProfile prints where the GPU's time went per decode step: busy
// (the dispatches' own time), span (first dispatch's start to last one's
// end, per submission) and the kernels that took most of it.
func printGPUProfile(w io.Writer, p *gpu.Profile, steps int) {
	per := func(d time.Duration) time.Duration { return d / time.Duration(steps) }
	if slices.ContainsFunc(p.Kernels, func(k gpu.KernelTime) bool { return k.Kernel == "batch" }) {
		fmt.Fprintf(w, "  GPU time per step (--profile-submits, timestamps): batches %s in %.0f submits",
			per(p.Busy).Round(time.Microsecond), float64(p.Submits)/float64(steps))
	} else {
		fmt.Fprintf(w, "  GPU time per step (--profile-gpu, timestamps): busy %s, span %s, %.0f dispatches in %.0f submits",
			per(p.Busy).Round(time.Microsecond), per(p.Span).Round(time.Microsecond), float64(p.Dispatches)/float64(steps), float64(p.Submits)/float64(steps))
	}
	if p.Untimed > 0 {
		fmt.Fprintf(w, " (%d untimed)", p.Untimed)
	}
	fmt.Fprintln(w)
	if p.Window > 0 {
		var before []string
		for _, k := range slices.Sorted(maps.Keys(p.IdleBefore)) {
			before = append(before, fmt.Sprintf("%s %s", k, per(p.IdleBefore[k]).Round(time.Microsecond)))
		}
		fmt.Fprintf(w, "    copies %s; GPU idle %s of %s (%.0f%%), waiting before: %s\n", per(p.Copies).Round(time.Microsecond),
			per(p.Idle).Round(time.Microsecond), per(p.Window).Round(time.Microsecond), 100*float64(p.Idle)/float64(p.Window), strings.Join(before, ", "))
		pairs := slices.SortedFunc(maps.Keys(p.IdleBetween), func(a, b string) int { return cmp.Compare(p.IdleBetween[b], p.IdleBetween[a]) })
		var between []string
		for _, k := range pairs[:min(len(pairs), 6)] {
			between = append(between, fmt.Sprintf("%s %s", k, per(p.IdleBetween[k]).Round(time.Microsecond)))
		}
		fmt.Fprintf(w, "    idle between: %s\n", strings.Join(between, ", "))
	}
	for i, k := range p.Kernels {
		if i == 20 {
			fmt.Fprintf(w, "    ... %d more (--json: gpuProfile)\n", len(p.Kernels)-i)
			break
		}
		fmt.Fprintf(w, "    %-22s %-16s %6.1f a step %8.1f us each %8.3f ms a step (%4.1f%%)\n", k.Kernel, fmt.Sprintf("%dx%dx%d", k.Groups[0], k.Groups[1], k.Groups[2]),
			float64(k.Count)/float64(steps), float64(k.Total.Microseconds())/float64(k.Count), float64(per(k.Total).Microseconds())/1e3, 100*float64(k.Total)/float64(max(p.Busy, 1)))
	}
}

// autoBool is a flag that is auto, true or false (a bare --flag is true).
type autoBool struct{ auto, on bool }

func (b *autoBool) String() string {
	if b.auto {
		return "auto"
	}
	return strconv.FormatBool(b.on)
}
func (b *autoBool) Type() string { return "auto|true|false" }
func (b *autoBool) Set(s string) error {
	if s == "auto" {
		*b = autoBool{auto: true}
		return nil
	}
	on, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want auto, true or false")
	}
	*b = autoBool{on: on}
	return nil
}
