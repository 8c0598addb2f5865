package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/swarm"
	"github.com/spf13/cobra"
)

// storeCommands returns init, add, get, cat, ls, pin, unpin, gc, scrub, stat.
func storeCommands(a *app) []*cobra.Command {
	return []*cobra.Command{
		initCmd(a), addCmd(a), getCmd(a), catCmd(a), lsCmd(a), statCmd(a),
		pinCmd(a), unpinCmd(a), gcCmd(a), scrubCmd(a),
	}
}

// openStore opens the store in the peer's home, creating it if needed.
func (a *app) openStore() (*cas.Store, error) {
	// RDRR_KEEP_DOWNLOAD_CACHE=1 keeps a download's pages cached (see
	// cas.Options.KeepDownloadCache): for measuring the default against.
	keep := os.Getenv("RDRR_KEEP_DOWNLOAD_CACHE") == "1"
	return cas.Open(a.home, cas.Options{Logger: a.log, KeepDownloadCache: keep})
}

// withStore runs fn with the store open and closes it afterwards.
func (a *app) withStore(fn func(*cas.Store) error) error {
	st, err := a.openStore()
	if err != nil {
		return err
	}
	err = fn(st)
	return errors.Join(err, st.Close())
}

// withBlob parses arg as a CID and runs fn with the store open.
func (a *app) withBlob(arg string, fn func(*cas.Store, cas.CID) error) error {
	c, err := cas.ParseCID(arg)
	if err != nil {
		return err
	}
	return a.withStore(func(st *cas.Store) error { return fn(st, c) })
}

// withBlobs parses args as CIDs and runs fn with the store open.
func (a *app) withBlobs(args []string, fn func(*cas.Store, []cas.CID) error) error {
	cids, err := parseCIDs(args)
	if err != nil {
		return err
	}
	return a.withStore(func(st *cas.Store) error { return fn(st, cids) })
}

func parseCIDs(args []string) ([]cas.CID, error) {
	out := make([]cas.CID, len(args))
	for i, s := range args {
		c, err := cas.ParseCID(s)
		if err != nil {
			return nil, err
		}
		out[i] = c
	}
	return out, nil
}

const defaultConfig = `# rdrr peer configuration. Every command-line flag --foo-bar can be set
# here as foo_bar = value (flags and RDRR_FOO_BAR variables win).
# log_level = "info"
# signal = "ws://127.0.0.1:7777"
`

func initCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "init",
		Short: "Create the peer home: store, index and Ed25519 identity (idempotent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := os.MkdirAll(a.home, 0o700); err != nil {
				return err
			}
			id, created, err := swarm.InitIdentity(a.home)
			if err != nil {
				return err
			}
			conf := filepath.Join(a.home, "config.toml")
			if _, err := os.Stat(conf); os.IsNotExist(err) {
				if err := os.WriteFile(conf, []byte(defaultConfig), 0o644); err != nil {
					return err
				}
			}
			if err := a.withStore(func(*cas.Store) error { return nil }); err != nil {
				return err
			}
			out := struct {
				Home    string `json:"home"`
				PeerID  string `json:"peer_id"`
				Created bool   `json:"created"`
			}{a.home, id.ID.String(), created}
			return a.print(out, func(w io.Writer) {
				verb := "existing"
				if created {
					verb = "new"
				}
				fmt.Fprintf(w, "home    %s\npeer id %s (%s identity)\n", a.home, id.ID, verb)
			})
		},
	}
}

type addResult struct {
	Path       string  `json:"path"`
	CID        cas.CID `json:"cid"`
	Size       int64   `json:"size"`
	Collection bool    `json:"collection,omitempty"`
	Shards     int     `json:"shards,omitempty"`
	Seconds    float64 `json:"seconds"`
}

func addCmd(a *app) *cobra.Command {
	var pin string
	var quiet bool
	cmd := &cobra.Command{
		Use:   "add <file | model dir>...",
		Short: "Store files (files over 64 MiB become 64 MiB shards plus a collection) or a model directory (manifest.json and its shards: one collection)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var results []addResult
			err := a.withStore(func(st *cas.Store) error {
				for _, path := range args {
					if isModelDir(path) {
						r, err := a.addModel(cmd, st, path, pin, quiet)
						if err != nil {
							return fmt.Errorf("add %s: %w", path, err)
						}
						results = append(results, r)
						continue
					}
					if err := checkAddable(path); err != nil {
						return fmt.Errorf("add %s: %w", path, err)
					}
					t0 := time.Now()
					prog := newProgress(cmd.ErrOrStderr(), "add "+filepath.Base(path), quiet || a.jsonOut)
					inf, err := st.AddFile(cmd.Context(), path, prog.update)
					prog.done()
					if err != nil {
						return fmt.Errorf("add %s: %w", path, err)
					}
					if pin != "" {
						if err := st.Pin(inf.CID, pin); err != nil {
							return err
						}
					}
					r := addResult{Path: path, CID: inf.CID, Size: inf.Size, Collection: inf.Collection, Seconds: time.Since(t0).Seconds()}
					if inf.Collection {
						r.Size = fileSize(path)
						links, _ := st.Links(inf.CID)
						r.Shards = len(links)
					}
					results = append(results, r)
					if !a.jsonOut {
						fmt.Fprintf(a.out, "%s  %s  %s\n", inf.CID, formatBytes(r.Size), path)
					}
				}
				return nil
			})
			if err != nil || !a.jsonOut {
				return err
			}
			return a.print(results, nil)
		},
	}
	cmd.Flags().StringVar(&pin, "pin", cas.PinUser, "pin the added blobs with this reason (empty: do not pin)")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress output")
	return cmd
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func getCmd(a *app) *cobra.Command {
	var out, signalURL, topic, downloadRate string
	var force bool
	cmd := &cobra.Command{
		Use:   "get <cid> -o <path>",
		Short: "Write a blob or collection to a file, fetching it from the swarm if --signal is given",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return errors.New("get: -o <path> is required (use -o - for standard output)")
			}
			return a.withBlob(args[0], func(st *cas.Store, c cas.CID) error {
				have := complete(st, c)
				if !have && signalURL == "" {
					return fmt.Errorf("get %s: %w here; give --signal URL to fetch it from the swarm", c, cas.ErrNotFound)
				}
				o, err := openOutput(out, force)
				if err != nil {
					return fmt.Errorf("get %s: %w", c, err)
				}
				defer o.abort()
				var tee *teeOut
				if !have {
					// A file or device takes the pieces as they are
					// verified; a pipe gets the file after the fetch.
					ctx, cancel := context.WithCancelCause(cmd.Context())
					defer cancel(nil)
					var verified func(cas.CID, int64, []byte)
					if o.positional {
						tee = newTeeOut(o.f, st, c, cancel)
						verified = tee.verified
					}
					if err := fetchFromSwarm(ctx, a, st, c, signalURL, topic, downloadRate, verified); err != nil {
						if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
							err = cause // the output failed
						}
						return fmt.Errorf("get %s: %w", c, err)
					}
				}
				fr, err := st.OpenFile(c)
				if err != nil {
					return err
				}
				var n, streamed int64
				if tee != nil {
					n, streamed, err = tee.fill(fr)
				} else if f, werr := o.Writer(); werr != nil {
					err = werr
				} else {
					n, err = fr.WriteTo(f)
				}
				if err == nil {
					err = o.commit()
				}
				if err != nil {
					return fmt.Errorf("get %s: %w", c, err)
				}
				if out == "-" {
					return nil
				}
				res := struct {
					CID  cas.CID `json:"cid"`
					Path string  `json:"path"`
					Size int64   `json:"size"`
					// Streamed: the bytes written into the output as the
					// fetch verified them; the rest were read back from
					// the store (held before, or not a collection's shard).
					Streamed int64 `json:"streamed"`
				}{c, out, n, streamed}
				return a.print(res, func(w io.Writer) { fmt.Fprintf(w, "%s  %s  %s\n", c, formatBytes(n), out) })
			})
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "output path, or - for standard output (a device or pipe is written through; a symbolic link is followed)")
	cmd.Flags().BoolVarP(&force, "force", "f", false, "replace the file at the output path if one exists (its mode is kept)")
	cmd.Flags().StringVar(&signalURL, "signal", "", "signaling server to find peers through when the blob is not here (ws://host:port)")
	cmd.Flags().StringVar(&topic, "topic", "", "swarm topic to look for providers in (default: the rdrr swarm and the CID's own topic)")
	cmd.Flags().StringVar(&downloadRate, "download-rate", "", "cap on the bytes a second fetched from peers (e.g. 10MiB; default: none)")
	return cmd
}

// complete reports whether c, and every shard if it is a collection, is
// stored.
func complete(st *cas.Store, c cas.CID) bool {
	inf, err := st.Stat(c)
	if err != nil || inf.Corrupt {
		return false
	}
	if !inf.Collection {
		return true
	}
	col, err := st.Collection(c)
	if err != nil {
		return false
	}
	for _, sh := range col.Shards {
		if !st.Has(sh.CID) {
			return false
		}
	}
	return true
}

func catCmd(a *app) *cobra.Command {
	var off, length int64
	cmd := &cobra.Command{
		Use:   "cat <cid>",
		Short: "Print a blob's bytes (verified), optionally a range",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withBlob(args[0], func(st *cas.Store, c cas.CID) error {
				fr, err := st.OpenFile(c)
				if err != nil {
					return err
				}
				if off < 0 || off > fr.Size() {
					return fmt.Errorf("cat: offset %d outside blob of %d bytes", off, fr.Size())
				}
				n := fr.Size() - off
				if length >= 0 {
					n = min(n, length)
				}
				_, err = io.Copy(a.out, io.NewSectionReader(fr, off, n))
				return err
			})
		},
	}
	cmd.Flags().Int64Var(&off, "offset", 0, "first byte")
	cmd.Flags().Int64Var(&length, "length", -1, "bytes to print (default: to the end)")
	return cmd
}

func lsCmd(a *app) *cobra.Command {
	var pinned bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List stored blobs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var infos []cas.Info
			err := a.withStore(func(st *cas.Store) error {
				return st.List(func(inf cas.Info) error {
					if !pinned || len(inf.Pins) > 0 {
						infos = append(infos, inf)
					}
					return nil
				})
			})
			if err != nil {
				return err
			}
			if infos == nil {
				infos = []cas.Info{}
			}
			return a.print(infos, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "CID\tSIZE\tKIND\tPINS\tREFS")
				var total int64
				for _, inf := range infos {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", inf.CID, formatBytes(inf.Size), kind(inf), pinReasons(inf.Pins), inf.Refs)
					total += inf.Size
				}
				tw.Flush()
				fmt.Fprintf(w, "%d blobs, %s\n", len(infos), formatBytes(total))
			})
		},
	}
	cmd.Flags().BoolVar(&pinned, "pinned", false, "only pinned blobs")
	return cmd
}

func kind(inf cas.Info) string {
	switch {
	case inf.Corrupt:
		return "CORRUPT"
	case inf.Collection:
		return "collection"
	}
	return "blob"
}

func pinReasons(pins []cas.Pin) string {
	if len(pins) == 0 {
		return "-"
	}
	r := make([]string, len(pins))
	for i, p := range pins {
		r[i] = p.Reason
	}
	return strings.Join(r, ",")
}

func statCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "stat <cid>",
		Short: "Show what the store knows of a blob",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withBlob(args[0], func(st *cas.Store, c cas.CID) error {
				inf, err := st.Stat(c)
				if err != nil {
					return err
				}
				return a.print(inf, func(w io.Writer) {
					fmt.Fprintf(w, "cid       %s\nhex       %s\nsize      %s (%d bytes)\nkind      %s\npins      %s\nrefs      %d\nadded     %s\naccessed  %s\nverified  %s\n",
						inf.CID, inf.CID.Hex(), formatBytes(inf.Size), inf.Size, kind(inf), pinReasons(inf.Pins), inf.Refs,
						inf.Added.Format(time.RFC3339), inf.Accessed.Format(time.RFC3339), inf.Verified.Format(time.RFC3339))
				})
			})
		},
	}
}

func pinCmd(a *app) *cobra.Command {
	var reason string
	var replicas int
	cmd := &cobra.Command{
		Use:   "pin <cid>...",
		Short: "Keep blobs from garbage collection (--replicas: keep R live copies across the swarm)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if replicas != 0 {
				// The daemon running on this home keeps the target and
				// tells the swarm's replicating daemons.
				var out []map[string]any
				for _, arg := range args {
					c, err := cas.ParseCID(arg)
					if err != nil {
						return err
					}
					var ans map[string]any
					if err := a.apiPost("/api/v1/pin", map[string]any{"cid": c.String(), "reason": reason, "replicas": replicas}, &ans); err != nil {
						return err
					}
					out = append(out, ans)
				}
				return a.print(out, func(w io.Writer) {
					for _, arg := range args {
						fmt.Fprintf(w, "pinned %s (%s), %d replicas\n", arg, reason, replicas)
					}
				})
			}
			return a.withBlobs(args, func(st *cas.Store, cids []cas.CID) error {
				for _, c := range cids {
					if err := st.Pin(c, reason); err != nil {
						return err
					}
				}
				return a.print(map[string]any{"pinned": cids, "reason": reason}, func(w io.Writer) {
					for _, c := range cids {
						fmt.Fprintf(w, "pinned %s (%s)\n", c, reason)
					}
				})
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", cas.PinUser, "why: user, manifest, kernel, or your own word")
	cmd.Flags().IntVar(&replicas, "replicas", 0, "keep this many live copies of every shard across the swarm (1..64; through the daemon of this home, whose peers started with --replicate fetch what lacks copies)")
	return cmd
}

func unpinCmd(a *app) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "unpin <cid>...",
		Short: "Remove a pin (all pins with --reason '')",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withBlobs(args, func(st *cas.Store, cids []cas.CID) error {
				var removed []cas.CID
				for _, c := range cids {
					ok, err := st.Unpin(c, reason)
					if err != nil {
						return err
					}
					if ok {
						removed = append(removed, c)
					} else {
						a.log.Warn("no such pin", "cid", c, "reason", reason)
					}
				}
				return a.print(map[string]any{"unpinned": removed}, func(w io.Writer) {
					for _, c := range removed {
						fmt.Fprintf(w, "unpinned %s\n", c)
					}
				})
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", cas.PinUser, "which pin to remove ('' for all)")
	return cmd
}

func gcCmd(a *app) *cobra.Command {
	var budget string
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Remove unpinned, unreferenced blobs (least recently used first, down to --budget)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			limit := int64(-1)
			if budget != "" {
				b, err := parseBytes(budget)
				if err != nil {
					return fmt.Errorf("--budget: %w", err)
				}
				limit = b
			}
			return a.withStore(func(st *cas.Store) error {
				rep, err := st.GC(cmd.Context(), limit)
				if err != nil {
					return err
				}
				if rep.Removed == nil {
					rep.Removed = []cas.CID{}
				}
				return a.print(rep, func(w io.Writer) {
					fmt.Fprintf(w, "removed %d blobs, freed %s; store now %s (%s pinned or referenced)\n",
						len(rep.Removed), formatBytes(rep.Freed), formatBytes(rep.After), formatBytes(rep.Kept))
					if limit >= 0 && rep.After > limit {
						fmt.Fprintf(w, "note: still over the budget of %s: the rest is pinned or referenced\n", formatBytes(limit))
					}
				})
			})
		},
	}
	cmd.Flags().StringVar(&budget, "budget", "", "keep the store under this size, e.g. 200GiB (default: remove every unpinned blob)")
	return cmd
}

func scrubCmd(a *app) *cobra.Command {
	var rateFlag string
	cmd := &cobra.Command{
		Use:   "scrub",
		Short: "Re-hash every blob (rate-limited); report and quarantine bad ones (exit status 3)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var rate int64
			if rateFlag != "" && rateFlag != "0" {
				r, err := parseBytes(strings.TrimSuffix(rateFlag, "/s"))
				if err != nil {
					return fmt.Errorf("--rate: %w", err)
				}
				rate = r
			}
			var rep cas.ScrubReport
			err := a.withStore(func(st *cas.Store) error {
				prog := newProgress(cmd.ErrOrStderr(), "scrub", a.jsonOut)
				var err error
				rep, err = st.Scrub(cmd.Context(), cas.ScrubOptions{Rate: rate, Progress: func(done, total int64, c cas.CID, err error) {
					prog.update(done, total)
					if err != nil {
						a.log.Error("bad blob", "cid", c, "err", err)
					}
				}})
				prog.done()
				return err
			})
			if err != nil {
				return err
			}
			if rep.Bad == nil {
				rep.Bad = []cas.BadBlob{}
			}
			a.print(rep, func(w io.Writer) {
				fmt.Fprintf(w, "checked %d blobs, %s: %d bad\n", rep.Blobs, formatBytes(rep.Bytes), len(rep.Bad))
				for _, b := range rep.Bad {
					fmt.Fprintf(w, "BAD %s: %s\n", b.CID, b.Reason)
				}
				for _, c := range rep.Repaired {
					fmt.Fprintf(w, "repaired outboard of %s\n", c)
				}
			})
			if len(rep.Bad) > 0 {
				return &exitError{code: 3, msg: fmt.Sprintf("%d bad blobs", len(rep.Bad))}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&rateFlag, "rate", "200MiB/s", "read at most this many bytes per second (0: no limit)")
	return cmd
}
