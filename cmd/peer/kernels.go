package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/kernels"
	"github.com/rdrr/peer/kernels/lab"
	"github.com/rdrr/peer/swarm"
	"github.com/spf13/cobra"
)

// toolVersion is recorded in endorsements.
const toolVersion = "rdrr-peer/lab-1"

// kernelsCommands returns `peer kernels` and its subcommands.
func kernelsCommands(a *app) []*cobra.Command {
	cmd := &cobra.Command{
		Use:   "kernels",
		Short: "The kernel lab: gate, benchmark, endorse, pull and choose WGSL kernel variants",
		Long: `Kernel variants are WGSL plus a descriptor, stored by CID. Every variant is run
through the correctness gate (fresh random inputs on several shapes against the
float64 reference, poisoned and guarded outputs, a time limit) in a child process
before it is timed or used; endorsements only decide what is worth trying.`,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if err := a.setup(cmd); err != nil {
				return err
			}
			return a.gpuEnv()
		},
	}
	cmd.AddCommand(kernelsAddCmd(a), kernelsBenchCmd(a), kernelsEndorseCmd(a), kernelsImportCmd(a),
		kernelsPullCmd(a), kernelsUseCmd(a), kernelsListCmd(a), kernelsStatusCmd(a), kernelsWorkerCmd(a))
	return []*cobra.Command{cmd}
}

// labFlags are the flags of the commands that run kernels.
type labFlags struct {
	gpu     *gpu.Options
	timeout time.Duration
	runs    int
}

func addLabFlags(cmd *cobra.Command) *labFlags {
	f := &labFlags{gpu: gpuFlags(cmd)}
	cmd.Flags().DurationVar(&f.timeout, "kernel-timeout", 10*time.Second, "time limit of one submission of a variant")
	cmd.Flags().IntVar(&f.runs, "runs", 50, "timed batches of each variant")
	return f
}

// isolated returns the lab that runs each call in a `peer kernels worker`.
func (a *app) isolated(f *labFlags) (*lab.Isolated, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return &lab.Isolated{
		Command: func() *exec.Cmd {
			return exec.Command(exe, "kernels", "worker", "--home", a.home, "--log-level", "error")
		},
		GPU:             gpu.Options{Backend: f.gpu.Backend, Adapter: f.gpu.Adapter},
		DispatchTimeout: f.timeout,
		Log:             a.log,
	}, nil
}

// kernelEnv is what the commands that gate or pull share.
type kernelEnv struct {
	st       *cas.Store
	reg      *kernels.Registry
	builtins map[string]*kernels.Artifact
}

func (a *app) withKernels(ctx context.Context, fn func(*kernelEnv) error) error {
	return a.withStore(func(st *cas.Store) error {
		reg, err := kernels.OpenRegistry(filepath.Join(a.home, "kernels"), nil)
		if err != nil {
			return err
		}
		defer reg.Close()
		bs, err := kernels.RegisterBuiltins(ctx, st)
		if err != nil {
			return err
		}
		return fn(&kernelEnv{st: st, reg: reg, builtins: bs})
	})
}

// parseShape parses "32x4096" (or the op's default shape when s is empty).
func parseShape(op, s string) ([]int, error) {
	if s == "" {
		if d := lab.DefaultShape(op); d != nil {
			return d, nil
		}
		return nil, fmt.Errorf("--shape is needed for %s (%s)", op, strings.Join(kernels.ShapeDims(op), "x"))
	}
	var dims []int
	for _, p := range strings.Split(s, "x") {
		v, err := strconv.Atoi(p)
		if err != nil {
			return nil, fmt.Errorf("--shape %q: %v", s, err)
		}
		dims = append(dims, v)
	}
	if _, err := kernels.Bucket(op, dims...); err != nil {
		return nil, err
	}
	return dims, nil
}

func kernelsAddCmd(a *app) *cobra.Command {
	var op, entry, parent string
	var consts []string
	cmd := &cobra.Command{
		Use:   "add <file.wgsl> --op <op> [--entry main] [--const NAME=VALUE]... [--parent cid]",
		Short: "Put a WGSL kernel variant of an op into the store (it is not gated or used yet)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			src, err := io.ReadAll(io.LimitReader(f, kernels.MaxWGSLBytes+1))
			f.Close()
			if err != nil {
				return err
			}
			if len(src) > kernels.MaxWGSLBytes {
				return fmt.Errorf("%s: larger than %d bytes", args[0], kernels.MaxWGSLBytes)
			}
			cs := map[string]float64{}
			for _, c := range consts {
				name, val, ok := strings.Cut(c, "=")
				v, err := strconv.ParseFloat(val, 64)
				if !ok || err != nil {
					return fmt.Errorf("--const %q: want NAME=NUMBER", c)
				}
				cs[name] = v
			}
			var par *cas.CID
			if parent != "" {
				p, err := cas.ParseCID(parent)
				if err != nil {
					return err
				}
				par = &p
			}
			author := ""
			if id, err := swarm.LoadIdentity(a.home); err == nil {
				author = id.ID.String()
			}
			v, err := kernels.NewVariant(op, src, entry, cs, par, author)
			if err != nil {
				return err
			}
			return a.withStore(func(st *cas.Store) error {
				if err := v.Put(cmd.Context(), st); err != nil {
					return err
				}
				for _, c := range []cas.CID{v.CID, v.Descriptor.WGSL} {
					if err := st.Pin(c, "kernel"); err != nil {
						return err
					}
				}
				out := struct {
					CID        cas.CID            `json:"cid"`
					Descriptor kernels.Descriptor `json:"descriptor"`
				}{v.CID, v.Descriptor}
				return a.print(out, func(w io.Writer) { fmt.Fprintln(w, v.CID) })
			})
		},
	}
	cmd.Flags().StringVar(&op, "op", "", "the op the variant computes ("+strings.Join(kernels.Ops(), ", ")+")")
	cmd.Flags().StringVar(&entry, "entry", "main", "entry point")
	cmd.Flags().StringArrayVar(&consts, "const", nil, "override constant NAME=VALUE (repeatable)")
	cmd.Flags().StringVar(&parent, "parent", "", "the variant this one was derived from")
	cmd.MarkFlagRequired("op")
	return cmd
}

// benchRow is one line of `peer kernels bench`.
type benchRow struct {
	Op          string               `json:"op"`
	Shape       []int                `json:"shape"`
	Candidate   cas.CID              `json:"candidate"`
	Baseline    cas.CID              `json:"baseline"`
	Gate        string               `json:"gate"` // "ok" or why not
	GateShapes  int                  `json:"gateShapes,omitempty"`
	CandidateUs float64              `json:"candidateUs,omitempty"`
	BaselineUs  float64              `json:"baselineUs,omitempty"`
	FloorUs     float64              `json:"floorUs,omitempty"`
	Speedup     float64              `json:"speedup,omitempty"`
	Low         float64              `json:"speedupLow,omitempty"`
	High        float64              `json:"speedupHigh,omitempty"`
	Endorsable  bool                 `json:"endorsable"`
	Error       string               `json:"error,omitempty"`
	Result      *kernels.BenchResult `json:"result,omitempty"`
}

func kernelsBenchCmd(a *app) *cobra.Command {
	var variant, shape string
	cmd := &cobra.Command{
		Use:   "bench <op|all> [--variant cid] [--shape 32x4096]",
		Short: "Gate a variant and time it against the op's active kernel (the built-in against itself without --variant)",
		Args:  cobra.ExactArgs(1),
	}
	lf := addLabFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ops := []string{args[0]}
		if args[0] == "all" {
			if variant != "" || shape != "" {
				return fmt.Errorf("bench all takes no --variant or --shape")
			}
			ops = lab.Ops()
		}
		w, err := a.isolated(lf)
		if err != nil {
			return err
		}
		ctx := cmd.Context()
		var rows []benchRow
		err = a.withKernels(ctx, func(env *kernelEnv) error {
			for _, op := range ops {
				dims, err := parseShape(op, shape)
				if err != nil {
					return err
				}
				base, err := baselineFor(env, op)
				if err != nil {
					return err
				}
				cand := base
				if variant != "" {
					c, err := cas.ParseCID(variant)
					if err != nil {
						return err
					}
					if cand, err = kernels.Load(env.st, c); err != nil {
						return err
					}
					if cand.Descriptor.Op != op {
						return fmt.Errorf("variant %s is of %s, not %s", c, cand.Descriptor.Op, op)
					}
				}
				rows = append(rows, benchOne(ctx, w, cand, base, dims, lf.runs))
			}
			return nil
		})
		if err != nil {
			return err
		}
		return a.print(rows, func(w io.Writer) { printBench(w, rows) })
	}
	cmd.Flags().StringVar(&variant, "variant", "", "the variant to time (a descriptor CID in the store)")
	cmd.Flags().StringVar(&shape, "shape", "", "the op's shape, dimensions joined by x (default: a decode step's)")
	return cmd
}

// baselineFor is op's active variant (the built-in when none was chosen).
func baselineFor(env *kernelEnv, op string) (*kernels.Artifact, error) {
	if act := env.reg.Active(op); act != kernels.Builtin {
		c, err := cas.ParseCID(act)
		if err != nil {
			return nil, err
		}
		return kernels.Load(env.st, c)
	}
	b := env.builtins[op]
	if b == nil {
		return nil, fmt.Errorf("%w: %q", kernels.ErrUnknownOp, op)
	}
	return b, nil
}

func benchOne(ctx context.Context, w *lab.Isolated, cand, base *kernels.Artifact, dims []int, runs int) benchRow {
	row := benchRow{Op: cand.Descriptor.Op, Shape: dims, Candidate: cand.CID, Baseline: base.CID, Gate: "ok"}
	seed := uint64(time.Now().UnixNano()) & (1<<53 - 1)
	rep, err := w.Check(ctx, cand, seed)
	row.GateShapes = len(rep.Shapes)
	if err != nil {
		row.Gate, row.Error = "refused", err.Error()
		return row
	}
	res, err := w.Compare(ctx, cand, base, dims, kernels.BenchOptions{Runs: runs, Seed: seed + 1})
	if err != nil {
		row.Error = err.Error()
		if errors.Is(err, kernels.ErrGate) {
			row.Gate = "refused by the benchmark's checks"
		}
		return row
	}
	row.Result = &res
	row.FloorUs = float64(res.FloorNs) / 1e3
	s, err := kernels.Summarize(res)
	if err != nil {
		row.Error = err.Error()
		return row
	}
	row.CandidateUs, row.BaselineUs = float64(s.CandidateNs)/1e3, float64(s.BaselineNs)/1e3
	row.Speedup, row.Low, row.High = s.Median, s.Low, s.High
	row.Endorsable = cand.CID != base.CID && s.Median >= kernels.MinSpeedup && s.Low > 1
	return row
}

func printBench(w io.Writer, rows []benchRow) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "op\tshape\tvariant\tgate\tus\tbaseline us\tspeedup [95%]\tfloor us\tendorsable")
	for _, r := range rows {
		shape := strings.Trim(strings.ReplaceAll(fmt.Sprint(r.Shape), " ", "x"), "[]")
		v := "builtin"
		if r.Candidate != r.Baseline {
			v = short(r.Candidate)
		}
		if r.Error != "" && r.Speedup == 0 {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t-\t-\t-\t-\tno: %s\n", r.Op, shape, v, r.Gate, r.Error)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s (%d shapes)\t%.1f\t%.1f\t%.3f [%.3f, %.3f]\t%.2f\t%v\n", r.Op, shape, v, r.Gate, r.GateShapes,
			r.CandidateUs, r.BaselineUs, r.Speedup, r.Low, r.High, r.FloorUs, r.Endorsable)
	}
	tw.Flush()
}

func short(c cas.CID) string { s := c.String(); return "..." + s[len(s)-10:] }

func kernelsEndorseCmd(a *app) *cobra.Command {
	var shape, out string
	cmd := &cobra.Command{
		Use:   "endorse <cid> [--shape 32x4096] [--out records.jsonl]",
		Short: "Gate and time a variant here; sign an endorsement only if it is >= 1.2x faster (interval above 1)",
		Args:  cobra.ExactArgs(1),
	}
	lf := addLabFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c, err := cas.ParseCID(args[0])
		if err != nil {
			return err
		}
		id, err := swarm.LoadIdentity(a.home)
		if err != nil {
			return fmt.Errorf("%w (run peer init)", err)
		}
		w, err := a.isolated(lf)
		if err != nil {
			return err
		}
		ctx := cmd.Context()
		class, _, err := w.Info(ctx)
		if err != nil {
			return err
		}
		return a.withKernels(ctx, func(env *kernelEnv) error {
			v, err := kernels.Load(env.st, c)
			if err != nil {
				return err
			}
			dims, err := parseShape(v.Descriptor.Op, shape)
			if err != nil {
				return err
			}
			e := &kernels.Endorser{Registry: env.reg, Store: env.st, Gate: w, Bench: w, Class: class, Key: id.Key,
				Tool: toolVersion, Baselines: env.builtins}
			r, err := e.Endorse(ctx, c, dims, kernels.BenchOptions{Runs: lf.runs})
			if err != nil {
				if r.Speedup.Median > 0 {
					return fmt.Errorf("not endorsed: %w (measured %.3fx [%.3f, %.3f] over %s)", err, r.Speedup.Median, r.Speedup.Low, r.Speedup.High, r.Baseline.CID)
				}
				return fmt.Errorf("not endorsed: %w", err)
			}
			rec := r.Signed.Encode()
			if out != "" {
				f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
				if err != nil {
					return err
				}
				_, err = f.Write(append(rec, '\n'))
				if cerr := f.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					return err
				}
			}
			return a.print(json.RawMessage(rec), func(w io.Writer) {
				en := r.Signed.Endorsement
				fmt.Fprintf(w, "endorsed %s (%s %s) on %s: %.3fx [%.3f, %.3f] over %s\n", en.Kernel, en.Op, en.Shape, en.Class,
					en.Speedup, en.SpeedupLow, en.SpeedupHigh, en.Baseline)
			})
		})
	}
	cmd.Flags().StringVar(&shape, "shape", "", "the op's shape, dimensions joined by x (default: a decode step's)")
	cmd.Flags().StringVar(&out, "out", "", "also append the signed record to this file (one record a line)")
	return cmd
}

func kernelsImportCmd(a *app) *cobra.Command {
	var anyDriver bool
	cmd := &cobra.Command{
		Use:   "import <records.jsonl>",
		Short: "Verify endorsement records (one a line, as gossip carries them) and store the valid ones",
		Args:  cobra.ExactArgs(1),
	}
	lf := addLabFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		f, err := os.Open(args[0])
		if err != nil {
			return err
		}
		defer f.Close()
		w, err := a.isolated(lf)
		if err != nil {
			return err
		}
		class, _, err := w.Info(cmd.Context())
		if err != nil {
			return err
		}
		return a.withKernels(cmd.Context(), func(env *kernelEnv) error {
			recv := &kernels.Receiver{V: &kernels.Verifier{Class: class, AnyDriver: anyDriver, ABI: kernels.ABIVersions()}, Registry: env.reg}
			sc := bufio.NewScanner(io.LimitReader(f, 64<<20))
			sc.Buffer(make([]byte, 0, 4096), kernels.MaxEndorsementBytes+1)
			for sc.Scan() {
				if line := bytes.TrimSpace(sc.Bytes()); len(line) > 0 {
					recv.Handle("", line)
				}
			}
			if err := sc.Err(); err != nil {
				return err
			}
			st := recv.Stats()
			return a.print(st, func(w io.Writer) {
				fmt.Fprintf(w, "accepted %d, duplicate %d, dropped %v\n", st.Accepted, st.Duplicate, st.Dropped)
			})
		})
	}
	cmd.Flags().BoolVar(&anyDriver, "any-driver", false, "accept endorsements for this device with another driver")
	return cmd
}

// parseTrust reads --trust quorum=N and --trust-keys.
func parseTrust(trust, keysPath string, anyDriver bool) (kernels.Policy, error) {
	p := kernels.Policy{AnyDriver: anyDriver}
	if trust != "" {
		v, ok := strings.CutPrefix(trust, "quorum=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || n < 1 || n > 1000 {
			return p, fmt.Errorf("--trust %q: want quorum=N", trust)
		}
		p.Quorum = n
	}
	if keysPath != "" {
		f, err := os.Open(keysPath)
		if err != nil {
			return p, err
		}
		defer f.Close()
		if p.Trusted, err = kernels.ReadTrustedKeys(f); err != nil {
			return p, err
		}
		if trust == "" {
			p.Quorum = 1000 // with a key file and no quorum: trusted keys only
		}
	}
	return p, nil
}

// pullRow is what `peer kernels pull` did with one candidate.
type pullRow struct {
	Op        string   `json:"op"`
	Variant   cas.CID  `json:"variant"`
	Shape     string   `json:"shape"`
	Endorsers []string `json:"endorsers"`
	Claimed   float64  `json:"claimedSpeedup"`
	Measured  float64  `json:"measuredSpeedup,omitempty"`
	Low       float64  `json:"measuredLow,omitempty"`
	Activated bool     `json:"activated"`
	Error     string   `json:"error,omitempty"`
}

func kernelsPullCmd(a *app) *cobra.Command {
	var op, trust, keys string
	var anyDriver bool
	cmd := &cobra.Command{
		Use:   "pull [--op op] [--trust quorum=2 | --trust-keys file]",
		Short: "Try the endorsed variants for this device: gate and time each here, activate one only if it is faster here",
		Args:  cobra.NoArgs,
	}
	lf := addLabFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		pol, err := parseTrust(trust, keys, anyDriver)
		if err != nil {
			return err
		}
		w, err := a.isolated(lf)
		if err != nil {
			return err
		}
		ctx := cmd.Context()
		class, _, err := w.Info(ctx)
		if err != nil {
			return err
		}
		ops := lab.Ops()
		if op != "" {
			ops = []string{op}
		}
		var rows []pullRow
		err = a.withKernels(ctx, func(env *kernelEnv) error {
			// Fetcher: none yet; variants must be in the store (the swarm
			// fetch is wired with the daemon).
			p := &kernels.Puller{Registry: env.reg, Store: env.st, Gate: w, Bench: w, Policy: pol, Class: class,
				Baselines: env.builtins, Log: a.log}
			for _, o := range ops {
				res, err := p.Pull(ctx, o)
				if err != nil {
					return err
				}
				for _, r := range res {
					row := pullRow{Op: o, Variant: r.Candidate.Kernel, Shape: r.Candidate.Shape, Endorsers: r.Candidate.Endorsers,
						Claimed: r.Candidate.Speedup, Measured: r.Speedup.Median, Low: r.Speedup.Low, Activated: r.Activated}
					if r.Err != nil {
						row.Error = r.Err.Error()
					}
					rows = append(rows, row)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		return a.print(rows, func(w io.Writer) {
			if len(rows) == 0 {
				fmt.Fprintf(w, "no candidates for %s under the trust policy\n", class)
				return
			}
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "op\tvariant\tshape\tendorsers\tclaimed\tmeasured here\tactivated")
			for _, r := range rows {
				why := ""
				if r.Error != "" {
					why = ": " + r.Error
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.2fx\t%.2fx\t%v%s\n", r.Op, r.Variant, r.Shape, len(r.Endorsers), r.Claimed, r.Measured, r.Activated, why)
			}
			tw.Flush()
		})
	}
	cmd.Flags().StringVar(&op, "op", "", "only this op (default: every op the lab runs)")
	cmd.Flags().StringVar(&trust, "trust", "", "quorum=N: distinct endorsing peers needed (default 2)")
	cmd.Flags().StringVar(&keys, "trust-keys", "", "file of trusted peer IDs (one endorsement from any is enough)")
	cmd.Flags().BoolVar(&anyDriver, "any-driver", false, "count endorsements for this device with another driver")
	return cmd
}

func kernelsUseCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "use <op> <cid|builtin|previous>",
		Short: "Make a variant the op's active kernel (after the gate passes here), the built-in, or the previous one",
		Args:  cobra.ExactArgs(2),
	}
	lf := addLabFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		op, which := args[0], args[1]
		if kernels.ABIVersion(op) == 0 {
			return fmt.Errorf("%w: %q", kernels.ErrUnknownOp, op)
		}
		ctx := cmd.Context()
		return a.withKernels(ctx, func(env *kernelEnv) error {
			var now string
			switch which {
			case kernels.Builtin:
				if err := env.reg.Use(op, kernels.Builtin); err != nil {
					return err
				}
				now = kernels.Builtin
			case "previous":
				v, err := env.reg.Rollback(op)
				if err != nil {
					return err
				}
				now = v
			default:
				c, err := cas.ParseCID(which)
				if err != nil {
					return err
				}
				v, err := kernels.Load(env.st, c)
				if err != nil {
					return err
				}
				if v.Descriptor.Op != op {
					return fmt.Errorf("variant %s is of %s, not %s", c, v.Descriptor.Op, op)
				}
				w, err := a.isolated(lf)
				if err != nil {
					return err
				}
				if _, err := w.Check(ctx, v, uint64(time.Now().UnixNano())&(1<<53-1)); err != nil {
					return fmt.Errorf("not used: %w", err)
				}
				if err := env.reg.Use(op, c.String()); err != nil {
					return err
				}
				now = c.String()
			}
			out := map[string]string{"op": op, "active": now, "previous": env.reg.Previous(op)}
			return a.print(out, func(w io.Writer) { fmt.Fprintf(w, "%s: %s (previous %s)\n", op, now, out["previous"]) })
		})
	}
	return cmd
}

// kernelList is `peer kernels list`.
type kernelList struct {
	Active       map[string]string     `json:"active"`
	Previous     map[string]string     `json:"previous"`
	Endorsements []kernels.Endorsement `json:"endorsements"`
	Candidates   []kernels.Candidate   `json:"candidates"` // under the default policy, any class
}

func kernelsListCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "Show the active kernels, the stored endorsements and the candidates they make",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withKernels(cmd.Context(), func(env *kernelEnv) error {
				l := kernelList{Active: env.reg.ActiveAll(), Previous: map[string]string{}, Endorsements: env.reg.Endorsements()}
				for op := range l.Active {
					if p := env.reg.Previous(op); p != "" {
						l.Previous[op] = p
					}
				}
				classes := map[string]kernels.DeviceClass{}
				for _, e := range l.Endorsements {
					classes[e.Class] = classOfExact(e.Class)
				}
				for _, c := range classes {
					l.Candidates = append(l.Candidates, kernels.Policy{}.Candidates(l.Endorsements, c, "", time.Now())...)
				}
				return a.print(l, func(w io.Writer) {
					tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "op\tactive\tprevious")
					ops := kernels.Ops()
					sort.Strings(ops)
					for _, op := range ops {
						fmt.Fprintf(tw, "%s\t%s\t%s\n", op, l.Active[op], l.Previous[op])
					}
					tw.Flush()
					fmt.Fprintf(w, "\n%d endorsements\n", len(l.Endorsements))
					tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
					for _, e := range l.Endorsements {
						p, _ := peer.Decode(e.Peer)
						fmt.Fprintf(tw, "%s\t%s\t%s\t%.2fx [%.2f, %.2f]\t%s\t%s\n", e.Op, e.Kernel, e.Shape, e.Speedup, e.SpeedupLow, e.SpeedupHigh, e.Class, p.ShortString())
					}
					tw.Flush()
					fmt.Fprintf(w, "\n%d candidates (quorum 2)\n", len(l.Candidates))
					for _, c := range l.Candidates {
						fmt.Fprintf(w, "%s\t%s\t%s\t%d endorsers\t%.2fx\n", c.Op, c.Kernel, c.Shape, len(c.Endorsers), c.Speedup)
					}
				})
			})
		},
	}
}

// classOfExact splits an exact class back into its parts.
func classOfExact(s string) kernels.DeviceClass {
	p := strings.SplitN(s, "/", 4)
	for len(p) < 4 {
		p = append(p, "")
	}
	return kernels.DeviceClass{Backend: p[0], Vendor: p[1], Device: p[2], Driver: p[3]}
}

func kernelsWorkerCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:    "worker",
		Short:  "Run one gate or benchmark request from stdin (the lab's child process)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// ServeWorker leaves the device open (a kernel may still hold
			// it); main returns right after, which ends the process.
			return lab.ServeWorker(cmd.Context(), os.Stdin, os.Stdout)
		},
	}
}
