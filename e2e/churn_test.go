package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdrr/peer/cas"
)

// Churn: a seeder whose upload is capped and a leecher that fetches a
// collection from it, both daemons; for two minutes, other daemons join
// (each its own process, a fresh home), fetch the same collection and
// leave mid-transfer, killed (SIGKILL) or stopped (SIGTERM, which must
// exit 0 within 15 s), at most four at once, in a loop bounded in count
// and time. The leecher's fetch completes byte-exact; the APIs answer
// throughout (no deadlock); and once the churners are gone, the seeder's
// and the leecher's goroutines are back near what they were before the
// churn (no goroutine growth) and their heaps and resident memory stayed
// bounded, as their /metrics say.
func TestSwarmChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the peer binary")
	}
	t.Parallel() // its two minutes beside the tests that allow it (doc.go)
	peer := peerBinary(t)
	dir := t.TempDir()
	size := int64(cas.ShardSize + 30<<20 + 5)
	path := writeRandomFile(t, dir, 4242, size)
	homes := initHomes(t, peer, dir, "seed", "leech")
	seedHome, leechHome := homes[0], homes[1]
	cid := peerAdd(t, peer, seedHome, path).String()

	sigAddr := freeAddr(t)
	common := []string{"--signal", "ws://" + sigAddr, "--announce-interval", "300ms"}
	quiet := append(common, "--log-level", "warn")
	// 2 MiB/s, shared with the churners' fetches: the leecher's fetch
	// runs from the seeder and from churners that hold pieces, and ends
	// about when the churn does (seen done 112 s into it; at 1 MiB/s it ran
	// a minute past it, a minute of make test spent waiting). Every byte
	// comes from the seeder first, so by construction the fetch spans at
	// least the first 45 s of the churn; the churners' own fetches run
	// throughout.
	seed := startDaemon(t, peer, seedHome, append(common, "--signal-listen", sigAddr, "--upload-rate", "2MiB")...)
	leech := startDaemon(t, peer, leechHome, common...)
	waitFor(t, "both daemons online", 30*time.Second, func() bool { return seed.status(t).Online && leech.status(t).Online })
	job := leech.startFetch(t, cid)
	time.Sleep(3 * time.Second) // the fetch runs: its goroutines are counted in the baseline
	stable := []*daemon{seed, leech}
	type health struct{ goroutines, heap, rss float64 }
	read := func(d *daemon) health {
		m := d.metrics(t)
		return health{m["go_goroutines"], m["go_memstats_heap_inuse_bytes"], m["process_resident_memory_bytes"]}
	}
	base := []health{read(seed), read(leech)}
	peak := slices.Clone(base)
	t.Logf("before the churn: seeder %+v, leecher %+v", base[0], base[1])

	period := 2 * time.Minute
	const maxChurners, maxAlive = 100, 4
	rng := rand.New(rand.NewPCG(7, 7))
	type churner struct {
		d    *daemon
		stop time.Time
	}
	var alive []churner
	var joined, killed, stopped int
	leave := func(c churner) {
		if rng.IntN(2) == 0 {
			c.d.cmd.Process.Kill()
			c.d.cmd.Wait()
			killed++
			return
		}
		c.d.stop(t) // SIGTERM: exit 0 within 15 s, or the test fails
		stopped++
	}
	start := time.Now()
	var doneAt time.Time // when the leecher's fetch was seen done
	for joined < maxChurners && time.Since(start) < period {
		// Leave: those whose time is up.
		rest := alive[:0]
		for _, c := range alive {
			if time.Now().After(c.stop) {
				leave(c)
			} else {
				rest = append(rest, c)
			}
		}
		alive = rest
		// Join: one more, if there is room.
		if len(alive) < maxAlive {
			h := initHomes(t, peer, dir, fmt.Sprintf("c%d", joined))[0]
			d := startDaemon(t, peer, h, quiet...)
			joined++
			alive = append(alive, churner{d: d, stop: time.Now().Add(time.Duration(2000+rng.IntN(6000)) * time.Millisecond)})
			go func() {
				// Ask it to fetch once it is in the swarm; it may be gone
				// before it answers.
				deadline := time.Now().Add(10 * time.Second)
				for time.Now().Before(deadline) && d.cmd.ProcessState == nil {
					if code, _, err := tryDo(d, "POST", "/api/v1/fetch", d.tokenOrEmpty(), map[string]string{"cid": cid}); err == nil && code == 202 {
						return
					}
					time.Sleep(200 * time.Millisecond)
				}
			}()
		}
		// The stable daemons answer (a deadlock would hang these calls:
		// the client times out), and their memory is watched.
		for i, d := range stable {
			h := read(d)
			peak[i] = health{max(peak[i].goroutines, h.goroutines), max(peak[i].heap, h.heap), max(peak[i].rss, h.rss)}
		}
		if j := leech.job(t, job); j.State == "failed" {
			t.Fatalf("the leecher's fetch failed during the churn: %s", j.Error)
		} else if j.State == "done" && doneAt.IsZero() {
			doneAt = time.Now()
		}
		time.Sleep(time.Second)
	}
	for _, c := range alive {
		leave(c)
	}
	t.Logf("churn: %d joined, %d killed, %d stopped in %v; peak seeder %+v, leecher %+v", joined, killed, stopped, time.Since(start).Round(time.Millisecond), peak[0], peak[1])
	waitFor(t, "the leecher's fetch", 3*time.Minute, func() bool {
		j := leech.job(t, job)
		if j.State == "failed" {
			t.Fatalf("the leecher's fetch failed: %s", j.Error)
		}
		return j.State == "done"
	})
	if doneAt.IsZero() {
		doneAt = time.Now()
	}
	t.Logf("the leecher's fetch was seen done %v after the churn began", doneAt.Sub(start).Round(time.Second))
	// Goroutines back near the baseline once the churners' connections
	// are gone (a dead peer's connection closes when ICE gives up on it):
	// within 64 of it, where a leak of two goroutines per churner would
	// be over 100 (a connection has dozens).
	var end []health
	ok := func() bool {
		end = []health{read(seed), read(leech)}
		for i := range stable {
			if end[i].goroutines > base[i].goroutines+64 {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(90 * time.Second)
	for !ok() && time.Now().Before(deadline) {
		time.Sleep(time.Second)
	}
	t.Logf("after the churn: seeder %+v, leecher %+v", end[0], end[1])
	for i, name := range []string{"seeder", "leecher"} {
		if end[i].goroutines > base[i].goroutines+64 {
			t.Errorf("%s: %v goroutines after the churn; %v before", name, end[i].goroutines, base[i].goroutines)
		}
		// Bounded: the serving budget (64 MiB), the open blobs of a fetch
		// and the stacks of its connections, whatever the churn.
		if peak[i].heap > 512<<20 || peak[i].rss > 1<<30 {
			t.Errorf("%s: peak heap %.0f MiB, resident %.0f MiB; want at most 512 MiB and 1 GiB", name, peak[i].heap/(1<<20), peak[i].rss/(1<<20))
		}
	}
	seed.stop(t)
	leech.stop(t)
	st, err := cas.Open(leechHome, cas.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c, _ := cas.ParseCID(cid)
	if !sameFile(t, st, c, path) {
		t.Fatal("the leecher's copy differs")
	}
}

// tryDo is do for a daemon that may be gone: errors are returned.
func tryDo(d *daemon, method, path, token string, body any) (int, []byte, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequest(method, d.api+path, bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := apiClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	return resp.StatusCode, rb, err
}

// tokenOrEmpty reads the daemon's token, or "" if it is not written yet.
func (d *daemon) tokenOrEmpty() string {
	b, _ := os.ReadFile(filepath.Join(d.home, "api.token"))
	return strings.TrimSpace(string(b))
}
