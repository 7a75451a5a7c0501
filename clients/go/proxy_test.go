package dlock

import (
	"net"
	"sync"
	"testing"
)

// proxy is the tests' own TCP proxy between the library and the server.
// blackhole(true) stops forwarding in both directions while keeping every
// socket open (the bytes are dropped, nothing is closed or reset), as a
// network that dies silently does; new connections are accepted and get
// nothing either. closeConns resets every connection through it.
type proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	black bool
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() *net.TCPAddr { return p.ln.Addr().(*net.TCPAddr) }

func (p *proxy) blackhole(on bool) {
	p.mu.Lock()
	p.black = on
	p.mu.Unlock()
}

func (p *proxy) isBlack() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.black
}

func (p *proxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns[c] = true
	p.mu.Unlock()
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.track(c)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				return
			}
			p.track(s)
			p.wg.Add(2)
			go p.pipe(s, c)
			go p.pipe(c, s)
		}()
	}
}

// pipe copies src to dst, dropping what arrives while blackholed.
func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if err != nil {
			src.Close()
			dst.Close()
			return
		}
		if p.isBlack() {
			continue
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			src.Close()
			dst.Close()
			return
		}
	}
}

// closeConns closes every connection through the proxy (the library's
// stuck calls then return).
func (p *proxy) closeConns() {
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]bool{}
	p.mu.Unlock()
}

func (p *proxy) close() {
	p.ln.Close()
	p.closeConns()
	p.wg.Wait()
}
