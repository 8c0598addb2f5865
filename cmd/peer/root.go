package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// app is what every command shares: resolved options, output and logger.
type app struct {
	home     string
	jsonOut  bool
	logLevel string
	out      io.Writer
	log      *slog.Logger
}

func newRootCmd() *cobra.Command {
	a := &app{out: os.Stdout}
	root := &cobra.Command{
		Use:   "peer",
		Short: "rdrr peer: a swarm of machines acting as one memory for very large models",
		Long: `rdrr peer stores 64 MiB weight shards and WGSL kernels by content (BLAKE3 CIDs),
exchanges them with other peers over WebRTC, and runs paged MoE inference on the GPU.

Configuration comes from $RDRR_HOME/config.toml, then RDRR_* environment variables,
then flags; flags win. A flag --foo-bar is the key foo_bar in config.toml and the
variable RDRR_FOO_BAR.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			return a.setup(cmd)
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.home, "home", "", "peer home directory (default $RDRR_HOME, $XDG_DATA_HOME/rdrr or ~/.local/share/rdrr)")
	pf.BoolVar(&a.jsonOut, "json", false, "print machine-readable JSON")
	pf.StringVar(&a.logLevel, "log-level", "info", "log level: debug, info, warn, error")

	root.AddCommand(storeCommands(a)...)
	root.AddCommand(gpuCommands(a)...)
	root.AddCommand(netCommands(a)...)
	root.AddCommand(modelCommands(a)...)
	root.AddCommand(tiersCommands(a)...)
	root.AddCommand(apiCommands(a)...)
	root.AddCommand(kernelsCommands(a)...)
	return root
}

// setup resolves the home directory, applies config.toml and RDRR_* values
// to every flag the user did not set, and builds the logger.
func (a *app) setup(cmd *cobra.Command) error {
	a.out = cmd.OutOrStdout()
	if a.home == "" {
		a.home = defaultHome()
	}
	path := filepath.Join(a.home, "config.toml")
	conf, err := loadConfig(path)
	if err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	var ferr error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Changed || ferr != nil || f.Name == "home" || f.Name == "help" {
			return
		}
		key := strings.ReplaceAll(f.Name, "-", "_")
		if v, ok := os.LookupEnv("RDRR_" + strings.ToUpper(key)); ok {
			if err := f.Value.Set(v); err != nil {
				ferr = fmt.Errorf("RDRR_%s: %w", strings.ToUpper(key), err)
			}
			return
		}
		if v, ok := conf[key]; ok {
			if err := setFromConfig(f, v); err != nil {
				ferr = fmt.Errorf("config %s: %s: %w", path, key, err)
			}
		}
	})
	if ferr != nil {
		return ferr
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(a.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	a.log = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
	return nil
}

// maxConfigSize bounds config.toml: it is a handful of flag values, and a
// file far larger than that is a mistake, not a configuration.
const maxConfigSize = 1 << 20

// loadConfig reads config.toml; a missing file is an empty configuration.
func loadConfig(path string) (map[string]any, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return map[string]any{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigSize+1))
	if err != nil {
		return nil, err
	}
	return parseConfig(data)
}

// parseConfig decodes config.toml's bytes: a table of flag names (with
// '_' for '-') to values. Only scalars and lists of scalars are flag
// values; nested tables are refused rather than ignored.
func parseConfig(data []byte) (map[string]any, error) {
	if len(data) > maxConfigSize {
		return nil, fmt.Errorf("larger than %d bytes", maxConfigSize)
	}
	conf := map[string]any{}
	if _, err := toml.Decode(string(data), &conf); err != nil {
		return nil, err
	}
	for k, v := range conf {
		if !configValue(v, true) {
			return nil, fmt.Errorf("%s: a table is not a flag value", k)
		}
	}
	return conf, nil
}

func configValue(v any, listOK bool) bool {
	switch v := v.(type) {
	case map[string]any, []map[string]any:
		return false
	case []any:
		if !listOK {
			return false
		}
		for _, item := range v {
			if !configValue(item, false) {
				return false
			}
		}
	}
	return true
}

func setFromConfig(f *pflag.Flag, v any) error {
	if list, ok := v.([]any); ok {
		for _, item := range list {
			if err := f.Value.Set(fmt.Sprint(item)); err != nil {
				return err
			}
		}
		return nil
	}
	return f.Value.Set(fmt.Sprint(v))
}

// defaultHome follows DESIGN.md: $RDRR_HOME, else $XDG_DATA_HOME/rdrr, else
// ~/.local/share/rdrr.
func defaultHome() string {
	if h := os.Getenv("RDRR_HOME"); h != "" {
		return h
	}
	if x := os.Getenv("XDG_DATA_HOME"); x != "" {
		return filepath.Join(x, "rdrr")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "share", "rdrr")
	}
	return ".rdrr"
}

// print writes v as indented JSON under --json, else calls human.
func (a *app) print(v any, human func(w io.Writer)) error {
	if a.jsonOut {
		enc := json.NewEncoder(a.out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	human(a.out)
	return nil
}
