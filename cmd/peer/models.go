package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/experts"
	"github.com/rdrr/peer/experts/convert"
	"github.com/rdrr/peer/swarm"
	"github.com/spf13/cobra"
)

// modelCommands returns synth, convert, mount and generate.
func modelCommands(a *app) []*cobra.Command {
	return []*cobra.Command{synthCmd(a), convertCmd(a), mountCmd(a), generateCmd(a)}
}

func convertCmd(a *app) *cobra.Command {
	var out, quant string
	var quiet bool
	cmd := &cobra.Command{
		Use:   "convert <model.gguf | dir with *.safetensors and config.json> -o <dir> [--quantize Q4_K]",
		Short: "Convert a GGUF file or a safetensors model into an RDRR model (manifest.json and 64 MiB shards, experts never split)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return errors.New("convert: -o <dir> is required")
			}
			if quant != "" && quant != "Q4_K" {
				return fmt.Errorf("convert: --quantize %q (only Q4_K)", quant)
			}
			t0 := time.Now()
			prog := newProgress(cmd.ErrOrStderr(), "convert "+filepath.Base(args[0]), quiet || a.jsonOut)
			m, err := convert.Convert(cmd.Context(), args[0], out, convert.Options{Quantize: quant != "", Progress: prog.update})
			prog.done()
			if err != nil {
				return err
			}
			mb, err := m.Encode()
			if err != nil {
				return err
			}
			cid := experts.ModelCID(mb, m)
			res := map[string]any{"cid": cid, "dir": out, "model": m.ModelID, "shards": len(m.Shards), "bytes": m.TotalSize,
				"tensors": len(m.Tensors), "experts": len(m.Experts), "seconds": time.Since(t0).Seconds()}
			return a.print(res, func(w io.Writer) {
				fmt.Fprintf(w, "%s  %s: %s in %d shards, %d tensors, %d experts (%.1f s)\n", cid, out, formatBytes(m.TotalSize), len(m.Shards), len(m.Tensors), len(m.Experts), time.Since(t0).Seconds())
			})
		},
	}
	cmd.Flags().StringVarP(&out, "out", "o", "", "directory to write")
	cmd.Flags().StringVar(&quant, "quantize", "", "quantize F32/F16/BF16 matrices: Q4_K")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress output")
	return cmd
}

// byteSize is a flag holding a size like 8GiB.
type byteSize int64

func (b *byteSize) String() string { return fmt.Sprint(int64(*b)) }
func (b *byteSize) Type() string   { return "size" }
func (b *byteSize) Set(s string) error {
	n, err := parseBytes(s)
	*b = byteSize(n)
	return err
}

// budgetFlags adds --vram, --ram and --disk.
func budgetFlags(cmd *cobra.Command, b *[3]byteSize) {
	b[0], b[1], b[2] = 8<<30, 8<<30, 200<<30
	cmd.Flags().Var(&b[0], "vram", "VRAM budget (e.g. 8GiB)")
	cmd.Flags().Var(&b[1], "ram", "RAM budget")
	cmd.Flags().Var(&b[2], "disk", "disk budget")
}

func synthCmd(a *app) *cobra.Command {
	var preset, out string
	var seed uint64
	var procedural, quiet bool
	cmd := &cobra.Command{
		Use:   "synth --preset tiny-moe|tiny-deepseek|mixtral-8x7b|deepseek-v3-671b -o <dir>",
		Short: "Write a deterministic synthetic model with a real shape (manifest.json and shards)",
		Long: `synth writes a model whose bytes are a pure function of (preset, seed, shard):
real BLAKE3 hashes of real bytes, made by a PRNG instead of training. With
--procedural only manifest.json is written; a seeder regenerates any shard
on demand (a 671B-shaped model needs 380 GB otherwise). Every shard is still
generated once to hash it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return errors.New("synth: -o <dir> is required")
			}
			p, err := experts.PresetByName(preset)
			if err != nil {
				return err
			}
			lo, err := experts.NewLayout(p, seed)
			if err != nil {
				return err
			}
			t0 := time.Now()
			prog := newProgress(cmd.ErrOrStderr(), "synth "+preset, quiet || a.jsonOut)
			err = lo.WriteModel(cmd.Context(), out, procedural, prog.update)
			prog.done()
			if err != nil {
				return err
			}
			m := lo.Manifest
			mb, err := m.Encode()
			if err != nil {
				return err
			}
			cid := experts.ModelCID(mb, m)
			res := map[string]any{
				"cid": cid, "dir": out, "preset": preset, "seed": seed, "procedural": procedural,
				"shards": len(m.Shards), "bytes": m.TotalSize, "tensors": len(m.Tensors), "experts": len(m.Experts),
				"seconds": time.Since(t0).Seconds(),
			}
			return a.print(res, func(w io.Writer) {
				fmt.Fprintf(w, "%s  %s: %s in %d shards, %d tensors, %d experts (%.1f s)\n",
					cid, filepath.Join(out, experts.ManifestFile), formatBytes(m.TotalSize), len(m.Shards), len(m.Tensors), len(m.Experts), time.Since(t0).Seconds())
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&preset, "preset", "tiny-moe", "model shape: tiny-moe, tiny-deepseek, mixtral-8x7b or deepseek-v3-671b")
	f.StringVarP(&out, "out", "o", "", "directory to write")
	f.Uint64Var(&seed, "seed", 1, "generator seed")
	f.BoolVar(&procedural, "procedural", false, "write only the manifest; shards are regenerated on demand")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress output")
	return cmd
}

func mountCmd(a *app) *cobra.Command {
	var budgets [3]byteSize
	cmd := &cobra.Command{
		Use:   "mount <manifest CID | model dir | manifest.json>",
		Short: "Plan a model from its manifest: what stays resident, what is paged, bytes per level (fetches no weights)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := a.loadManifest(args[0])
			if err != nil {
				return err
			}
			plan := experts.Mount(m, experts.Budgets{VRAM: int64(budgets[0]), RAM: int64(budgets[1]), Disk: int64(budgets[2])})
			return a.print(plan, plan.Print)
		},
	}
	budgetFlags(cmd, &budgets)
	return cmd
}

// loadManifest reads a manifest from a path, or from the store by CID.
func (a *app) loadManifest(arg string) (*experts.Manifest, error) {
	if _, err := os.Stat(arg); err == nil {
		return experts.ReadManifestFile(arg)
	}
	c, err := cas.ParseCID(arg)
	if err != nil {
		return nil, fmt.Errorf("%s: neither a file nor a CID (%v)", arg, err)
	}
	var m *experts.Manifest
	err = a.withStore(func(st *cas.Store) error {
		if !st.Has(c) {
			return fmt.Errorf("%s is not in the store (fetch it first: peer get %s -o /dev/null)", c, c)
		}
		m, err = experts.LoadManifest(st, c)
		return err
	})
	return m, err
}

// isModelDir reports whether path is a directory holding a manifest.json.
func isModelDir(path string) bool {
	fi, err := os.Stat(filepath.Join(path, experts.ManifestFile))
	return err == nil && fi.Mode().IsRegular()
}

// addModel stores a model directory as one collection, checking every
// shard against the manifest.
func (a *app) addModel(cmd *cobra.Command, st *cas.Store, dir, pin string, quiet bool) (addResult, error) {
	t0 := time.Now()
	prog := newProgress(cmd.ErrOrStderr(), "add "+filepath.Base(dir), quiet || a.jsonOut)
	inf, m, err := experts.AddModel(cmd.Context(), st, dir, prog.update)
	prog.done()
	if err != nil {
		return addResult{}, err
	}
	if pin != "" {
		if err := st.Pin(inf.CID, pin); err != nil {
			return addResult{}, err
		}
	}
	r := addResult{Path: dir, CID: inf.CID, Size: m.TotalSize, Collection: true, Shards: len(m.Shards) + 1, Seconds: time.Since(t0).Seconds()}
	if !a.jsonOut {
		fmt.Fprintf(a.out, "%s  %s  %s (model %s, %d shards)\n", inf.CID, formatBytes(r.Size), dir, m.ModelID, len(m.Shards))
	}
	return r, nil
}

func (nf *netFlags) addProcedural(cmd *cobra.Command) {
	cmd.Flags().StringSliceVar(&nf.procedural, "procedural", nil, "also serve the synthetic model of this manifest (from peer synth --procedural), regenerating its shards on demand (repeatable)")
}

// sources is what a serving peer offers: the store, then each procedural
// model.
func (a *app) sources(st *cas.Store, manifests []string) (swarm.Source, error) {
	srcs := multiSource{st}
	for _, path := range manifests {
		if isModelDir(path) {
			path = filepath.Join(path, experts.ManifestFile)
		}
		mb, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		ps, err := experts.NewProceduralSource(mb)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		a.log.Info("serving a procedural model", "model", ps.Manifest().ModelID, "cid", ps.CID(), "bytes", ps.Manifest().TotalSize)
		srcs = append(srcs, ps)
	}
	if len(srcs) == 1 {
		return st, nil
	}
	return srcs, nil
}

// multiSource serves from the first source that has a blob.
type multiSource []swarm.Source

func (ms multiSource) Stat(c cas.CID) (cas.Info, error) {
	var err error
	for _, s := range ms {
		var inf cas.Info
		if inf, err = s.Stat(c); err == nil {
			return inf, nil
		}
	}
	return cas.Info{}, err
}

func (ms multiSource) AppendSlice(dst []byte, c cas.CID, off, n int64) ([]byte, error) {
	for _, s := range ms {
		if _, err := s.Stat(c); err == nil {
			return s.AppendSlice(dst, c, off, n)
		}
	}
	return dst, fmt.Errorf("%s: %w", c, cas.ErrNotFound)
}
