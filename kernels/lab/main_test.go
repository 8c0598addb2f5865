package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/kernels"
)

// workerEnv makes the test binary a lab worker (Isolated's child).
const workerEnv = "RDRR_LAB_TEST_WORKER"

var testDev *gpu.Device // shared by the in-process tests; set by TestMain

func TestMain(m *testing.M) {
	if os.Getenv("XDG_RUNTIME_DIR") == "" {
		dir, _ := os.MkdirTemp("", "rdrr-xdg-")
		os.Setenv("XDG_RUNTIME_DIR", dir)
	}
	if os.Getenv(workerEnv) != "" {
		if err := ServeWorker(context.Background(), os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	d, err := gpu.Open(context.Background(), gpu.Options{Backend: testBackend()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "lab tests need an adapter (make deps installs lavapipe):", err)
		os.Exit(1)
	}
	testDev = d
	code := m.Run()
	d.Close()
	os.Exit(code)
}

// testBackend honours RDRR_GPU_BACKEND.
func testBackend() gpu.Backend {
	b, _ := gpu.ParseBackend(os.Getenv("RDRR_GPU_BACKEND"))
	return b
}

// isolated returns an Isolated whose children are this test binary.
func isolated() *Isolated {
	return &Isolated{
		Command: func() *exec.Cmd {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), workerEnv+"=1")
			return cmd
		},
		GPU: gpu.Options{Backend: testBackend()},
	}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func builtins(t testing.TB) map[string]*kernels.Artifact {
	bs, err := kernels.Builtins()
	if err != nil {
		t.Fatal(err)
	}
	return bs
}

// variant makes an artifact of op from a file (under testdata/ or variants/).
func variant(t testing.TB, op, path string, consts map[string]float64) *kernels.Artifact {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := kernels.NewVariant(op, src, "", consts, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	return a
}
