package e2e

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdrr/peer/cas"
)

// Byzantine peers in a swarm, every peer its own process: an honest
// seeder, one peer that serves corrupt groups (a byte flipped in every
// slice) and one that lies in HAVE (claims every piece of every shard and
// refuses each request for them as not_found), and three honest
// leechers that fetch the same collection at once, from all of them and
// from each other. Every leecher finishes and bans the flipper and no
// honest peer; the HAVE liar is banned by the leechers that found it
// lying about three blobs before they finished (at least one; usually
// all). Every copy is byte-exact, a scrub of every store finds nothing
// corrupt, and no download is left in progress.
func TestByzantinePeers(t *testing.T) {
	url := startSignal(t)
	dir := t.TempDir()
	// Four shards: the HAVE liar is banned at its third refused blob.
	size := int64(3*cas.ShardSize + 5<<20 + 77)
	path := writeRandomFile(t, dir, 17, size)
	homeSeed, c := newHome(t, path)
	homeFlip, _ := newHome(t, path)
	homeLie, _ := newHome(t, path)
	_, seedID := serveChild(t, url, homeSeed)
	_, flipID := serveChild(t, url, homeFlip, envFlip+"=every")
	_, lieID := serveChild(t, url, homeLie, envLie+"=have")
	bad := []string{flipID.String(), lieID.String()}

	const leechers = 3
	homes := make([]string, leechers)
	kids := make([]*child, leechers)
	start := time.Now()
	liarBans := 0
	for i := range kids {
		homes[i], _ = newHome(t, "")
		// They stay until every one is done: leechers serve each other.
		kids[i] = startChild(t, "fetch", envHome+"="+homes[i], envSignal+"="+url, envTopic+"=t", envCID+"="+c.String(), envStay+"=1")
	}
	for i, k := range kids {
		var evs []fetchEvent
		if err := json.Unmarshal([]byte(k.expect("events", 3*time.Minute)), &evs); err != nil {
			t.Fatal(err)
		}
		var banned []string
		if err := json.Unmarshal([]byte(k.expect("banned", time.Second)), &banned); err != nil {
			t.Fatal(err)
		}
		k.expect("done", time.Second)
		t.Logf("leecher %d done after %v; banned %v; events %v", i, time.Since(start).Round(time.Millisecond), banned, evs)
		if !slices.Contains(banned, flipID.String()) {
			t.Errorf("leecher %d did not ban the flipper %s", i, flipID)
		}
		if slices.Contains(banned, lieID.String()) {
			liarBans++
		}
		for _, b := range banned {
			if !slices.Contains(bad, b) {
				t.Errorf("leecher %d banned the honest peer %s (seeder %s)", i, b, seedID)
			}
		}
		kinds := map[string]string{}
		for _, e := range evs {
			kinds[e.Peer] += e.Kind + " "
		}
		if !strings.Contains(kinds[flipID.String()], "bad_data") {
			t.Errorf("leecher %d: no bad_data event for the flipper: %v", i, evs)
		}
	}
	// The HAVE liar is banned at the third blob a leecher finds it lying
	// about: a leecher that finished first has only dropped it (without
	// waiting on it: it finished).
	if liarBans == 0 {
		t.Errorf("no leecher banned the HAVE liar %s", lieID)
	}
	t.Logf("%d of %d leechers banned the HAVE liar", liarBans, leechers)
	for _, k := range kids {
		k.stop(10 * time.Second)
	}
	for i, h := range homes {
		st, err := cas.Open(h, cas.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if !sameFile(t, st, c, path) {
			t.Errorf("leecher %d's copy differs", i)
		}
		rep, err := st.Scrub(context.Background(), cas.ScrubOptions{})
		if err != nil || len(rep.Bad) > 0 {
			t.Errorf("leecher %d: scrub %+v: %v", i, rep, err)
		}
		if ps, err := st.Partials(); err != nil || len(ps) > 0 {
			t.Errorf("leecher %d: downloads left in progress %v (%v)", i, ps, err)
		}
		st.Close()
	}
}
