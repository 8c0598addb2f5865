package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/ops"
	"github.com/spf13/cobra"
)

// gpuCommands returns `peer gpu info` and `peer gpu selftest`.
func gpuCommands(a *app) []*cobra.Command {
	cmd := &cobra.Command{
		Use:   "gpu",
		Short: "GPU adapters and a self-test of the built-in kernels",
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if err := a.setup(cmd); err != nil {
				return err
			}
			return a.gpuEnv()
		},
	}
	cmd.AddCommand(gpuInfoCmd(a), gpuSelfTestCmd(a))
	return []*cobra.Command{cmd}
}

// gpuFlags adds --gpu-backend and --gpu-adapter to cmd and returns the
// options they fill.
func gpuFlags(cmd *cobra.Command) *gpu.Options {
	o := &gpu.Options{}
	cmd.Flags().Var(&o.Backend, "gpu-backend", "graphics API: vulkan, metal, dx12, gl or auto")
	cmd.Flags().StringVar(&o.Adapter, "gpu-adapter", "", "use the first adapter whose name, driver or vendor contains this")
	return o
}

func gpuInfoCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "info",
		Short: "List GPU adapters, best first (the one the peer uses comes first)",
		Args:  cobra.NoArgs,
	}
	o := gpuFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ads, err := gpu.ListAdapters(cmd.Context(), *o)
		if err != nil {
			return err
		}
		return a.print(ads, func(w io.Writer) {
			for i, ad := range ads {
				if i > 0 {
					fmt.Fprintln(w)
				}
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				l := ad.Limits
				fmt.Fprintf(tw, "adapter %d\t%s\n", i, ad)
				fmt.Fprintf(tw, "backend\t%s\n", ad.Backend)
				fmt.Fprintf(tw, "type\t%s\n", ad.Type)
				fmt.Fprintf(tw, "vendor\t%s (0x%04x)\n", ad.Vendor, ad.VendorID)
				fmt.Fprintf(tw, "device\t%s (0x%04x)\n", ad.Device, ad.DeviceID)
				fmt.Fprintf(tw, "driver\t%s\n", ad.Driver)
				fmt.Fprintf(tw, "shader-f16\t%v\n", ad.ShaderF16)
				fmt.Fprintf(tw, "subgroups\t%v\n", ad.Subgroups)
				fmt.Fprintf(tw, "max buffer\t%d\n", l.MaxBufferSize)
				fmt.Fprintf(tw, "max storage binding\t%d\n", l.MaxStorageBufferBindingSize)
				fmt.Fprintf(tw, "max workgroup storage\t%d\n", l.MaxComputeWorkgroupStorageSize)
				fmt.Fprintf(tw, "max invocations\t%d\n", l.MaxComputeInvocationsPerWorkgroup)
				fmt.Fprintf(tw, "features\t%s\n", strings.Join(ad.Features, " "))
				tw.Flush()
			}
		})
	}
	return cmd
}

func gpuSelfTestCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "selftest",
		Short: "Check the Q4_K kernels against the CPU reference and time a 64 MiB upload",
		Args:  cobra.NoArgs,
	}
	o := gpuFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		o.Logger = a.log
		d, err := gpu.Open(cmd.Context(), *o)
		if err != nil {
			return err
		}
		defer d.Close()
		rep, err := ops.SelfTest(cmd.Context(), d)
		if perr := a.print(rep, func(w io.Writer) {
			fmt.Fprintf(w, "device:        %v\n", rep.Device)
			fmt.Fprintf(w, "known blocks:  %v\n", ok(rep.KnownBlocks))
			fmt.Fprintf(w, "q4_k matvec:   %v (worst error %.2gx the tolerance; 4096x4096 in %.0f us incl. readback)\n", ok(rep.MatVec), rep.MatVecError, rep.MatVecMicros)
			fmt.Fprintf(w, "upload 64 MiB: %.1f GB/s staged, %.1f GB/s queue.WriteBuffer\n", rep.UploadGBps, rep.WriteGBps)
		}); perr != nil {
			return perr
		}
		return err
	}
	return cmd
}

func ok(b bool) string {
	if b {
		return "ok"
	}
	return "FAILED"
}

// gpuEnv prepares the process for the GPU: wgpu-native's log level follows
// --log-level, and Mesa's drivers get the writable XDG_RUNTIME_DIR they
// complain about when it is unset.
func (a *app) gpuEnv() error {
	var level slog.Level
	level.UnmarshalText([]byte(a.logLevel))
	gpu.SetNativeLogLevel(level)
	if os.Getenv("XDG_RUNTIME_DIR") == "" {
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("rdrr-xdg-%d", os.Getuid()))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		os.Setenv("XDG_RUNTIME_DIR", dir)
	}
	return nil
}
