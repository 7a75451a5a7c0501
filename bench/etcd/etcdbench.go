// bench/etcd/etcdbench.go: etcd's election (go.etcd.io/etcd/clientv3/concurrency,
// the etcd 3.4 client Debian packages) driven the way bench/lockbench and
// bench/observe drive dlock's, for bench/kinds.
//
//	etcdbench -mode cycles -clients N [-seconds S] [-keys K] [-endpoint E]
//	etcdbench -mode observe -observers W [-seconds S] [-interval-ms I]
//	          [-idle-s D] [-etcd-pid P] [-endpoint E]
//
// Every client (and every observer) has its own clientv3.Client (its own
// gRPC connection) and its own concurrency.Session (a lease with a 60 s TTL,
// kept alive by the client library), made before the clock starts.
//
// cycles: each client loops for S seconds on Campaign(ctx, "lockbench") of
// an election drawn at random out of K (/lb/<k>; K = 1: one election for
// everyone, where Campaign waits for the leader to resign) and Resign.  A
// cycle's latency runs from calling Campaign to Resign's return, the grant
// latency to Campaign's return.  Cycles that end after the S seconds are not
// counted.  Prints the "name value" lines of lockbench: workload, clients,
// seconds, cycles, cycles_per_s, p50_ms, p99_ms, max_ms, grant_p50_ms,
// grant_p99_ms, grant_max_ms.
//
// observe: one changer campaigns in /obs with value v0, then every I ms
// (drawn uniformly from 0.5 I to 1.5 I) for S seconds proclaims v1, v2, ...;
// each observer reads Observe(ctx)'s channel (a watch on the leader key:
// always waiting, as a LISTEN is).  The latency of a wake-up is its
// receipt minus the Proclaim's return (from_ack, negative when the observer
// heard first) or minus its call (from_send); "all" is, per proclaim, the
// latest observer.  With D > 0, first D seconds with nothing changing, over
// which the CPU of the etcd server (-etcd-pid) and of this process (all
// observers, their sessions' keep-alives) are read from /proc.  Prints the
// "name value" lines of bench/observe.
package main

import (
	"context"
	"flag"
	"fmt"
	"io/ioutil"
	"math"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
)

var (
	mode      = flag.String("mode", "cycles", "cycles or observe")
	endpoint  = flag.String("endpoint", "127.0.0.1:2379", "etcd client URL host:port")
	clients   = flag.Int("clients", 1, "cycles: clients")
	seconds   = flag.Float64("seconds", 5, "seconds of the loop")
	keys      = flag.Int("keys", 100000, "cycles: elections to draw from")
	observers = flag.Int("observers", 1, "observe: observers")
	interval  = flag.Float64("interval-ms", 20, "observe: mean interval between proclaims")
	idleS     = flag.Float64("idle-s", 0, "observe: seconds of waiting on an unchanged key first")
	etcdPid   = flag.Int("etcd-pid", 0, "observe: the etcd server's pid, for its CPU")
)

func die(format string, a ...interface{}) {
	fmt.Fprintf(os.Stderr, "etcdbench: "+format+"\n", a...)
	os.Exit(1)
}

// session: a client of its own and a session (lease, 60 s TTL) on it
func session() *concurrency.Session {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{*endpoint},
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		die("connect: %v", err)
	}
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(60))
	if err != nil {
		die("session: %v", err)
	}
	return s
}

// percentile (nearest rank) of sorted v, in ms
func pct(v []float64, q float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(v)))) - 1
	if i < 0 {
		i = 0
	}
	return v[i]
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// cpuSeconds: user + system CPU of a process, from /proc/<pid>/stat
func cpuSeconds(pid int) float64 {
	b, err := ioutil.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return math.NaN()
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100 // USER_HZ is 100 on Linux
}

func cycles() {
	sessions := make([]*concurrency.Session, *clients)
	for i := range sessions {
		sessions[i] = session()
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var cyc, grant []float64
	start := time.Now()
	deadline := start.Add(time.Duration(*seconds * 1e9))
	for i := range sessions {
		wg.Add(1)
		go func(s *concurrency.Session, seed int64) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed))
			var c, g []float64
			ctx := context.Background()
			for time.Now().Before(deadline) {
				e := concurrency.NewElection(s, fmt.Sprintf("/lb/%d", rng.Intn(*keys)))
				t0 := time.Now()
				if err := e.Campaign(ctx, "lockbench"); err != nil {
					die("campaign: %v", err)
				}
				tg := time.Now()
				if err := e.Resign(ctx); err != nil {
					die("resign: %v", err)
				}
				t1 := time.Now()
				if t1.Before(deadline) {
					c = append(c, ms(t1.Sub(t0)))
					g = append(g, ms(tg.Sub(t0)))
				}
			}
			mu.Lock()
			cyc = append(cyc, c...)
			grant = append(grant, g...)
			mu.Unlock()
		}(sessions[i], time.Now().UnixNano()+int64(i))
	}
	wg.Wait()
	sort.Float64s(cyc)
	sort.Float64s(grant)
	workload := "etcd-elect"
	if *keys == 1 {
		workload = "etcd-elect-hot"
	}
	fmt.Printf("workload %s\nclients %d\nseconds %g\nelapsed_s %.3f\ncycles %d\n",
		workload, *clients, *seconds, time.Since(start).Seconds(), len(cyc))
	fmt.Printf("cycles_per_s %.1f\nbusy 0\nbusy_per_s 0\n", float64(len(cyc)) / *seconds)
	fmt.Printf("p50_ms %.3f\np99_ms %.3f\nmax_ms %.3f\n", pct(cyc, 0.5), pct(cyc, 0.99), pct(cyc, 1))
	fmt.Printf("grant_p50_ms %.3f\ngrant_p99_ms %.3f\ngrant_max_ms %.3f\n",
		pct(grant, 0.5), pct(grant, 0.99), pct(grant, 1))
}

type event struct{ send, ack time.Time }
type ret struct {
	t     time.Time
	value int
}

func observe() {
	ctx, cancel := context.WithCancel(context.Background())
	leader := session()
	le := concurrency.NewElection(leader, "/obs")
	if err := le.Campaign(ctx, "v0"); err != nil {
		die("campaign: %v", err)
	}
	rets := make([][]ret, *observers)
	var ready, done sync.WaitGroup
	for i := 0; i < *observers; i++ {
		s := session()
		ready.Add(1)
		done.Add(1)
		go func(i int, s *concurrency.Session) {
			defer done.Done()
			ch := concurrency.NewElection(s, "/obs").Observe(ctx)
			first := true
			for r := range ch {
				t := time.Now()
				if first { // the current leader, v0
					first = false
					ready.Done()
					continue
				}
				v, err := strconv.Atoi(strings.TrimPrefix(string(r.Kvs[0].Value), "v"))
				if err != nil {
					die("observed value %q", r.Kvs[0].Value)
				}
				rets[i] = append(rets[i], ret{t, v})
			}
		}(i, s)
	}
	ready.Wait()
	time.Sleep(200 * time.Millisecond) // each watch is set up after its first answer
	idleCPU, idleSelf := math.NaN(), math.NaN()
	if *idleS > 0 {
		e0, s0 := cpuSeconds(*etcdPid), cpuSeconds(os.Getpid())
		time.Sleep(time.Duration(*idleS * 1e9))
		idleCPU, idleSelf = cpuSeconds(*etcdPid)-e0, cpuSeconds(os.Getpid())-s0
	}
	var events []event
	e0, s0 := cpuSeconds(*etcdPid), cpuSeconds(os.Getpid())
	start := time.Now()
	deadline := start.Add(time.Duration(*seconds * 1e9))
	for i := 1; time.Now().Before(deadline); i++ {
		time.Sleep(time.Duration(*interval * (0.5 + rand.Float64()) * 1e6))
		t := time.Now()
		if err := le.Proclaim(ctx, fmt.Sprintf("v%d", i)); err != nil {
			die("proclaim: %v", err)
		}
		events = append(events, event{t, time.Now()})
	}
	time.Sleep(200 * time.Millisecond) // let the last ones arrive
	wall := time.Since(start).Seconds() - 0.2
	e1, s1 := cpuSeconds(*etcdPid), cpuSeconds(os.Getpid())
	cancel()
	done.Wait()

	var fromAck, fromSend, rtt, all []float64
	last := make([]time.Time, len(events))
	negative, unmatched, n := 0, 0, 0
	for _, rs := range rets {
		for _, r := range rs {
			n++
			if r.value < 1 || r.value > len(events) {
				unmatched++
				continue
			}
			e := events[r.value-1]
			d := ms(r.t.Sub(e.ack))
			fromAck = append(fromAck, d)
			fromSend = append(fromSend, ms(r.t.Sub(e.send)))
			if d < 0 {
				negative++
			}
			if r.t.After(last[r.value-1]) {
				last[r.value-1] = r.t
			}
		}
	}
	for i, e := range events {
		rtt = append(rtt, ms(e.ack.Sub(e.send)))
		if !last[i].IsZero() {
			all = append(all, ms(last[i].Sub(e.ack)))
		}
	}
	for _, v := range [][]float64{fromAck, fromSend, rtt, all} {
		sort.Float64s(v)
	}
	nw := len(fromAck)
	fmt.Printf("observers %d\nevent proclaim\nvia etcd-observe\nchanges %d\n", *observers, len(events))
	fmt.Printf("changes_per_s %.1f\nchange_p50_ms %.3f\nreturns %d\nwakeups %d\n",
		float64(len(events))/wall, pct(rtt, 0.5), n, nw)
	fmt.Printf("wakeups_per_change %.2f\nlate 0\nunmatched %d\n", float64(nw)/float64(len(events)), unmatched)
	fmt.Printf("from_ack_p50_ms %.3f\nfrom_ack_p99_ms %.3f\nfrom_ack_max_ms %.3f\nfrom_ack_negative %d\n",
		pct(fromAck, 0.5), pct(fromAck, 0.99), pct(fromAck, 1), negative)
	fmt.Printf("from_send_p50_ms %.3f\nfrom_send_p99_ms %.3f\n", pct(fromSend, 0.5), pct(fromSend, 0.99))
	fmt.Printf("all_from_ack_p50_ms %.3f\nall_from_ack_p99_ms %.3f\n", pct(all, 0.5), pct(all, 0.99))
	fmt.Printf("loop_cpu_per_wall %.3f\n", (e1-e0)/wall)
	fmt.Printf("cpu_ms_per_wakeup %.3f\n", (e1-e0)*1000/float64(nw))
	fmt.Printf("client_loop_cpu_per_wall %.3f\n", (s1-s0)/wall)
	fmt.Printf("idle_s %.1f\nidle_cpu_s %.2f\nclient_idle_cpu_s %.2f\n", *idleS, idleCPU, idleSelf)
}

func main() {
	flag.Parse()
	switch *mode {
	case "cycles":
		cycles()
	case "observe":
		observe()
	default:
		die("unknown -mode %s", *mode)
	}
}
