package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// generate --cpuprofile with RDRR_CPUPROFILE set (the process already
// profiles itself) says so instead of failing in pprof, and writes no
// file; without it, the flag writes its profile.
func TestGenerateCPUProfileOnce(t *testing.T) {
	home, manifest := tinyProcedural(t)
	prof := filepath.Join(t.TempDir(), "gen.prof")
	args := []string{"generate", "-", "--procedural", manifest, "--prompt", "a", "--max-tokens", "1", "--cpuprofile", prof}
	t.Setenv(envCPUProfile, filepath.Join(t.TempDir(), "proc.prof"))
	_, err := run(t, home, args...)
	if err == nil || !strings.Contains(err.Error(), envCPUProfile) {
		t.Fatalf("with %s set: err = %v; want one naming it", envCPUProfile, err)
	}
	if _, err := os.Stat(prof); !os.IsNotExist(err) {
		t.Fatalf("the refused --cpuprofile left a file (%v)", err)
	}
	t.Setenv(envCPUProfile, "")
	mustRun(t, home, args...)
	if fi, err := os.Stat(prof); err != nil || fi.Size() == 0 {
		t.Fatalf("--cpuprofile wrote no profile (%v)", err)
	}
}

// generate --go-trace writes a Go execution trace of the generation.
func TestGenerateGoTrace(t *testing.T) {
	home, manifest := tinyProcedural(t)
	tr := filepath.Join(t.TempDir(), "gen.trace")
	mustRun(t, home, "generate", "-", "--procedural", manifest, "--prompt", "a", "--max-tokens", "1", "--go-trace", tr)
	b, err := os.ReadFile(tr)
	if err != nil || !strings.HasPrefix(string(b), "go 1.") {
		t.Fatalf("--go-trace wrote %d bytes (%v); want a Go trace (\"go 1.N trace\")", len(b), err)
	}
}
