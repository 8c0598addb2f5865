package swarm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/pion/webrtc/v4"
	"github.com/rdrr/peer/signaling"
	"github.com/rdrr/peer/swarm/wire"
)

// setup is one connection being negotiated through signaling: an offer we
// made (dial) or one we answer (accept).
type setup struct {
	n      *Node
	sig    Signaler
	remote peer.ID
	sid    string
	inbox  chan *signaling.Message // answer, candidate, bye from the remote
	// incoming: the remote offered, we answer
	incoming bool

	mu      sync.Mutex
	sent    bool                      // our offer/answer has gone out
	pending []webrtc.ICECandidateInit // local candidates gathered before that
	ctx     context.Context
}

// newSetup registers a setup so that route delivers the remote's messages
// to it. An incoming one (the remote offered) counts against the remote's
// MaxSetupsPerPeer.
func (n *Node) newSetup(ctx context.Context, remote peer.ID, sid string, incoming bool) (*setup, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.closed:
		return nil, ErrClosed
	case n.sig == nil:
		return nil, ErrNoSignaling
	case n.bannedLocked(remote):
		return nil, ErrBanned
	case len(n.setups) >= n.cfg.MaxSetups,
		len(n.links[remote]) >= n.cfg.MaxLinksPerPeer,
		n.nlinks >= n.cfg.MaxLinks:
		return nil, ErrLimit
	}
	if incoming {
		held := 0
		for k, s := range n.setups {
			if k.peer == remote && s.incoming {
				held++
			}
		}
		if held >= n.cfg.MaxSetupsPerPeer {
			return nil, fmt.Errorf("%w: %d connection setups from %s in progress", ErrLimit, held, remote)
		}
	}
	k := setupKey{remote, sid}
	if n.setups[k] != nil {
		return nil, fmt.Errorf("swarm: session %s with %s already in progress", sid, remote)
	}
	s := &setup{n: n, sig: n.sig, remote: remote, sid: sid, incoming: incoming, inbox: make(chan *signaling.Message, setupInbox), ctx: ctx}
	n.setups[k] = s
	return s, nil
}

func (n *Node) dropSetup(s *setup) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.setups[setupKey{s.remote, s.sid}] == s {
		delete(n.setups, setupKey{s.remote, s.sid})
	}
}

func (s *setup) send(typ string, data json.RawMessage) error {
	return s.sig.Send(s.ctx, &signaling.Message{Type: typ, To: s.remote.String(), SID: s.sid, Data: data})
}

// onCandidate trickles a local candidate, after our description.
func (s *setup) onCandidate(c *webrtc.ICECandidate) {
	if c == nil {
		return // gathering complete
	}
	init := c.ToJSON()
	if keep := s.n.tr.keep; keep != nil && !keep(init.Candidate) {
		return
	}
	s.mu.Lock()
	if !s.sent {
		s.pending = append(s.pending, init)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.sendCandidate(init)
}

func (s *setup) sendCandidate(c webrtc.ICECandidateInit) {
	data, err := json.Marshal(c)
	if err == nil {
		err = s.send(signaling.TypeCandidate, data)
	}
	if err != nil {
		s.n.log.Debug("swarm: send candidate", "peer", s.remote, "err", err)
	}
}

// described marks our description sent and flushes the candidates held
// back until then.
func (s *setup) described() {
	s.mu.Lock()
	s.sent = true
	pending := s.pending
	s.pending = nil
	s.mu.Unlock()
	for _, c := range pending {
		s.sendCandidate(c)
	}
}

// bye tells the remote the setup is abandoned, and why.
func (s *setup) bye(reason string) {
	data, _ := json.Marshal(map[string]string{"reason": reason})
	s.send(signaling.TypeBye, data)
}

// dial opens one link to remote: we offer, it answers.
func (n *Node) dial(ctx context.Context, remote peer.ID) (*link, error) {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.ConnectTimeout)
	defer cancel()
	sid := randomSID()
	s, err := n.newSetup(ctx, remote, sid, false)
	if err != nil {
		return nil, err
	}
	defer n.dropSetup(s)
	pc, err := n.tr.small.NewPeerConnection(n.tr.conf)
	if err != nil {
		return nil, fmt.Errorf("swarm: peer connection: %w", err)
	}
	l := newLink(n, remote, pc, n.cfg.BulkChannels)
	if !n.trackLink(l) {
		pc.Close()
		return nil, ErrClosed
	}
	ordered := true
	ctl, err := pc.CreateDataChannel(ctlLabel, &webrtc.DataChannelInit{Ordered: &ordered})
	if err != nil {
		l.close(err)
		return nil, err
	}
	l.addChannel(ctl, false)
	for i := 0; i < n.cfg.BulkChannels; i++ {
		dc, err := pc.CreateDataChannel(bulkLabelPrefix+strconv.Itoa(i), &webrtc.DataChannelInit{Ordered: &ordered})
		if err != nil {
			l.close(err)
			return nil, err
		}
		l.addChannel(dc, true)
	}
	pc.OnICECandidate(s.onCandidate)
	offer, err := pc.CreateOffer(nil)
	if err == nil {
		err = pc.SetLocalDescription(offer)
	}
	var data json.RawMessage
	if err == nil {
		caps := linkCaps{Bulk: n.cfg.BulkChannels, RecvMTU: n.tr.recvMTU}
		data, err = n.signDescription("offer", sid, remote, offer.SDP, caps)
	}
	if err == nil {
		err = s.send(signaling.TypeOffer, data)
	}
	if err != nil {
		l.close(err)
		return nil, fmt.Errorf("swarm: offer to %s: %w", remote, err)
	}
	s.described()
	n.stats.dialed.Add(1)
	if err := s.negotiate(ctx, l, true); err != nil {
		return nil, err
	}
	return l, nil
}

func (n *Node) signDescription(kind, sid string, to peer.ID, sdp string, caps linkCaps) (json.RawMessage, error) {
	if n.cfg.testHooks.mangleSDP != nil {
		sdp = n.cfg.testHooks.mangleSDP(kind, sdp)
	}
	key := n.id.Key
	if n.cfg.testHooks.signingKey != nil {
		key = n.cfg.testHooks.signingKey
	}
	var addrs []string
	if n.cfg.AnnounceAddrs != nil {
		for _, a := range n.cfg.AnnounceAddrs() {
			if len(a) <= maxP2PAddrLen && len(addrs) < maxP2PAddrs {
				addrs = append(addrs, a)
			}
		}
	}
	d, err := signDescriptionAddrs(key, kind, sid, n.id.ID, to, sdp, caps, addrs)
	if err == nil && n.cfg.testHooks.tamper != nil {
		d = n.cfg.testHooks.tamper(kind, d)
	}
	return d, err
}

// negotiate handles the remote's answer (if we offered) and candidates
// until the link is ready, fails, or ctx ends. It registers a ready link.
func (s *setup) negotiate(ctx context.Context, l *link, offerer bool) error {
	remoteSet := !offerer
	var early []webrtc.ICECandidateInit
	for {
		select {
		case m := <-s.inbox:
			switch m.Type {
			case signaling.TypeAnswer:
				if !offerer || remoteSet {
					continue
				}
				d, fps, err := verifyDescription(m.Data, "answer", s.sid, s.remote, s.n.id.ID)
				if err != nil {
					s.n.record(Event{Peer: s.remote, Kind: EventIdentity, Detail: err.Error()})
					l.close(err)
					return err
				}
				l.mu.Lock()
				l.fps = fps
				l.mu.Unlock()
				s.n.peerAddrs(s.remote, d)
				if s.n.bigMTUOK(s.remote) && s.n.tr.offeredBig(l.pc, d.Caps.RecvMTU) {
					l.mu.Lock()
					l.big = true
					l.mu.Unlock()
				}
				if err := l.pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: d.SDP}); err != nil {
					l.close(err)
					return fmt.Errorf("swarm: answer from %s: %w", s.remote, err)
				}
				remoteSet = true
				for _, c := range early {
					l.pc.AddICECandidate(c)
				}
				early = nil
			case signaling.TypeCandidate:
				var c webrtc.ICECandidateInit
				if json.Unmarshal(m.Data, &c) != nil || s.n.tr.keep != nil && !s.n.tr.keep(c.Candidate) {
					continue
				}
				if !remoteSet {
					if len(early) < setupInbox {
						early = append(early, c)
					}
					continue
				}
				if err := l.pc.AddICECandidate(c); err != nil {
					s.n.log.Debug("swarm: remote candidate", "peer", s.remote, "err", err)
				}
			case signaling.TypeError: // from the server (Node.refused)
				err := fmt.Errorf("swarm: connect to %s: %w", s.remote, &signaling.Error{Code: m.Code, Reason: m.Reason, Peer: m.Peer})
				l.close(err)
				return err
			case signaling.TypeBye:
				var why struct{ Reason string }
				json.Unmarshal(m.Data, &why)
				err := fmt.Errorf("%w: peer %s refused: %s", ErrLinkClosed, s.remote, why.Reason)
				l.close(err)
				return err
			}
		case <-l.ready:
			if err := s.n.addLink(l); err != nil {
				// A node that closed while this link was being set up is
				// going away, as Close tells its other links; any other
				// refusal (a ban, a limit) is shutting_down.
				code := wire.CodeShuttingDown
				if errors.Is(err, ErrClosed) {
					code = wire.CodeGoingAway
				}
				l.say(code, err.Error())
				l.close(err)
				return err
			}
			return nil
		case <-l.done:
			return l.errClosed()
		case <-ctx.Done():
			err := fmt.Errorf("swarm: connect to %s: %w", s.remote, ctx.Err())
			s.bye("timeout")
			l.close(err)
			return err
		}
	}
}

// acceptOffer answers an offer from remote, on its own goroutine.
func (n *Node) acceptOffer(remote peer.ID, m *signaling.Message) {
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.ConnectTimeout)
	s, err := n.newSetup(ctx, remote, m.SID, true)
	if err != nil {
		cancel()
		n.record(Event{Peer: remote, Kind: EventRefused, Detail: err.Error()})
		tmp := &setup{n: n, sig: n.signaler(), remote: remote, sid: m.SID, ctx: n.ctx}
		if tmp.sig != nil {
			n.wg.Add(1)
			go func() {
				defer n.wg.Done()
				bctx, stop := context.WithTimeout(n.ctx, 5*time.Second)
				defer stop()
				tmp.ctx = bctx
				tmp.bye(err.Error())
			}()
		}
		return
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer cancel()
		defer n.dropSetup(s)
		if err := n.answer(ctx, s, m); err != nil {
			n.log.Info("swarm: incoming connection failed", "peer", remote, "err", err)
		}
	}()
}

// peerAddrs passes the libp2p addresses of a verified description to
// Config.OnPeerAddrs.
func (n *Node) peerAddrs(p peer.ID, d *description) {
	if n.cfg.OnPeerAddrs == nil {
		return
	}
	if addrs := d.p2pAddrs(); len(addrs) > 0 {
		n.cfg.OnPeerAddrs(p, addrs)
	}
}

func (n *Node) signaler() Signaler {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sig
}

func (n *Node) answer(ctx context.Context, s *setup, m *signaling.Message) error {
	d, fps, err := verifyDescription(m.Data, "offer", s.sid, s.remote, n.id.ID)
	if err != nil {
		n.record(Event{Peer: s.remote, Kind: EventIdentity, Detail: err.Error()})
		s.bye("identity: " + err.Error())
		return err
	}
	n.peerAddrs(s.remote, d)
	if d.Caps.Bulk < 1 || d.Caps.Bulk > maxBulk {
		s.bye(fmt.Sprintf("bulk channels must be 1..%d", maxBulk))
		return fmt.Errorf("swarm: offer from %s asks for %d bulk channels", s.remote, d.Caps.Bulk)
	}
	api := n.tr.api(d.Caps.RecvMTU)
	if api == n.tr.big && !n.bigMTUOK(s.remote) {
		api = n.tr.small
	}
	pc, err := api.NewPeerConnection(n.tr.conf)
	if err != nil {
		return err
	}
	l := newLink(n, s.remote, pc, d.Caps.Bulk)
	l.big = api == n.tr.big
	if !n.trackLink(l) {
		pc.Close()
		return ErrClosed
	}
	l.mu.Lock()
	l.fps = fps
	l.mu.Unlock()
	// An offer abandoned by its sender (or by the network) frees its slot
	// after SetupProgress, not ConnectTimeout.
	stall := time.AfterFunc(n.cfg.SetupProgress, func() {
		switch pc.ICEConnectionState() {
		case webrtc.ICEConnectionStateConnected, webrtc.ICEConnectionStateCompleted:
			return
		}
		err := fmt.Errorf("%w: no ICE connectivity with %s in %v", ErrLinkClosed, s.remote, n.cfg.SetupProgress)
		l.close(err)
		s.bye("timeout: " + err.Error())
	})
	defer stall.Stop()
	pc.OnDataChannel(l.onDataChannel)
	pc.OnICECandidate(s.onCandidate)
	err = pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeOffer, SDP: d.SDP})
	var answer webrtc.SessionDescription
	if err == nil {
		answer, err = pc.CreateAnswer(nil)
	}
	if err == nil {
		err = pc.SetLocalDescription(answer)
	}
	var data json.RawMessage
	if err == nil {
		data, err = n.signDescription("answer", s.sid, s.remote, answer.SDP, linkCaps{RecvMTU: n.tr.recvMTU})
	}
	if err == nil {
		err = s.send(signaling.TypeAnswer, data)
	}
	if err != nil {
		l.close(err)
		return fmt.Errorf("swarm: answer to %s: %w", s.remote, err)
	}
	s.described()
	if err := s.negotiate(ctx, l, false); err != nil {
		return err
	}
	n.stats.accepted.Add(1)
	return nil
}

// Connect makes sure up to cfg.Links connections to p are open, opening
// the missing ones in parallel. It fails only if none is open.
func (n *Node) Connect(ctx context.Context, p peer.ID) error {
	_, err := n.connect(ctx, p)
	return err
}

func (n *Node) connect(ctx context.Context, p peer.ID) ([]*link, error) {
	return n.connectN(ctx, p, n.cfg.Links)
}

// connectN makes sure at least want links to p are open (see Connect).
func (n *Node) connectN(ctx context.Context, p peer.ID, want int) ([]*link, error) {
	if p == n.id.ID {
		return nil, errors.New("swarm: cannot connect to self")
	}
	have := n.linksTo(p)
	need := want - len(have)
	if need <= 0 {
		return have, nil
	}
	errs := make([]error, need)
	var wg sync.WaitGroup
	for i := range need {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = n.dial(ctx, p)
		}()
	}
	wg.Wait()
	if ls := n.linksTo(p); len(ls) > 0 {
		return ls, nil
	}
	return nil, fmt.Errorf("swarm: connect to %s: %w", p, errors.Join(errs...))
}
