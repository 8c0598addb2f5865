package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// config.toml is user-edited and may be anything: parsing it and applying
// its values to every command's flags must fail cleanly, never panic.
func FuzzConfig(f *testing.F) {
	f.Add([]byte("log_level = \"debug\"\n"))
	f.Add([]byte("ice_server = [\"stun:127.0.0.1:3478\", 7]\nlinks = 4\n"))
	f.Add([]byte("[table]\nx = 1\n"))
	f.Add([]byte("a = [[1, 2], {b = 3}]\n"))
	f.Add([]byte("json = true\nlinks = -1e400\n"))
	root := newRootCmd()
	f.Fuzz(func(t *testing.T, data []byte) {
		conf, err := parseConfig(data)
		if err != nil {
			return
		}
		for _, cmd := range root.Commands() {
			cmd.Flags().VisitAll(func(fl *pflag.Flag) {
				if v, ok := conf[strings.ReplaceAll(fl.Name, "-", "_")]; ok {
					setFromConfig(fl, v)
				}
			})
		}
	})
}
