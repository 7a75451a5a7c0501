// go_overhead: what the Go library's Acquire + Release costs over the raw
// SQL calls it wraps, with the same driver (lib/pq) and the same pool, at
// 1 and 8 clients, side by side in one run.
//
// Each client loops for -seconds over random keys out of 100,000: "raw" is
// SELECT owner FROM dlock.try_acquire(key, ttl) then
// SELECT dlock.release(key, owner); "library" is dlock.Acquire (try, no
// wait) then Lease.Release, which also starts and joins the renewing
// goroutine, reads the remaining time, and runs each call in a goroutine
// of its own. The two alternate (raw, library, raw, library per client
// count) so that drift hits both alike.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log"
	"math/rand"
	"sync"
	"sync/atomic"
	"time"

	"dlock"

	_ "github.com/lib/pq"
)

func main() {
	dsn := flag.String("dsn", "", "lib/pq connection string (required)")
	secs := flag.Float64("seconds", 5, "length of each round")
	rounds := flag.Int("rounds", 1, "rounds of each kind per client count")
	flag.Parse()
	if *dsn == "" {
		log.Fatal("-dsn is required")
	}
	d := time.Duration(*secs * float64(time.Second))
	fmt.Printf("%-8s %14s %14s %8s\n", "clients", "raw cycles/s", "lib cycles/s", "lib/raw")
	for _, clients := range []int{1, 8} {
		var raw, lib float64
		for r := 0; r < *rounds; r++ {
			raw += run(*dsn, clients, d, rawCycle)
			lib += run(*dsn, clients, d, libCycle)
		}
		raw /= float64(*rounds)
		lib /= float64(*rounds)
		fmt.Printf("%-8d %14.0f %14.0f %8.2f\n", clients, raw, lib, lib/raw)
	}
}

type cycle func(ctx context.Context, db *sql.DB, key string) error

func rawCycle(ctx context.Context, db *sql.DB, key string) error {
	var owner string
	err := db.QueryRowContext(ctx, `SELECT owner FROM dlock.try_acquire($1, $2::interval)`, key, "30 seconds").Scan(&owner)
	if err == sql.ErrNoRows {
		return nil
	}
	if err != nil {
		return err
	}
	var ok bool
	return db.QueryRowContext(ctx, `SELECT dlock.release($1, $2::uuid)`, key, owner).Scan(&ok)
}

func libCycle(ctx context.Context, db *sql.DB, key string) error {
	l, err := dlock.Acquire(ctx, db, key, dlock.Options{TTL: 30 * time.Second})
	if err == dlock.ErrBusy {
		return nil
	}
	if err != nil {
		return err
	}
	return l.Release(ctx)
}

// run: cycles per second of f over clients goroutines sharing one pool of
// as many connections, warmed up first.
func run(dsn string, clients int, d time.Duration, f cycle) float64 {
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(clients)
	db.SetMaxIdleConns(clients)
	ctx := context.Background()
	var n int64
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(d)
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			rnd := rand.New(rand.NewSource(seed))
			for time.Now().Before(stop) {
				if err := f(ctx, db, fmt.Sprintf("bench-go-%d", rnd.Intn(100000))); err != nil {
					log.Fatal(err)
				}
				atomic.AddInt64(&n, 1)
			}
		}(int64(c) + time.Now().UnixNano())
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds()
}
