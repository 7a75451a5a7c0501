package dlock_test

import (
	"context"
	"database/sql"
	"errors"
	"log"
	"time"

	"dlock"
)

var db *sql.DB // sql.Open("postgres", "host=db1 dbname=app binary_parameters=yes"), any driver

func syncStock(ctx context.Context) error { return nil }

// Hold a lease while working; stop when it is lost; write under its token.
func Example() {
	ctx := context.Background()
	lease, err := dlock.Acquire(ctx, db, "stock-sync:warehouse-42", dlock.Options{TTL: 30 * time.Second})
	if errors.Is(err, dlock.ErrBusy) {
		return // someone else does it
	} else if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)

	// work under lease.Context(): it is cancelled the moment the lease is lost
	tx, err := db.BeginTx(lease.Context(), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if err := lease.UseFence(lease.Context(), tx); err != nil {
		log.Fatal(err) // errors.Is(err, dlock.ErrLost): stop, the key has moved on
	}
	if _, err := tx.Exec(`UPDATE stock SET qty = 100 WHERE warehouse_id = 42`); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err) // a write refused by the fencing trigger is LF001: errors.Is(err, dlock.ErrLost)
	}
}

// Wait up to 10 seconds for the key, and be told at once when it is lost.
func ExampleAcquire() {
	ctx := context.Background()
	lease, err := dlock.Acquire(ctx, db, "nightly-export", dlock.Options{
		TTL:    time.Minute,
		Wait:   10 * time.Second,
		OnLost: func(err error) { log.Printf("stopping: %v", err) },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	if err := syncStock(lease.Context()); err != nil {
		log.Print(err)
	}
}

// A pool of 4 workers against an outside API: one of 4 permits each.
func ExampleAcquire_permits() {
	ctx := context.Background()
	lease, err := dlock.Acquire(ctx, db, "partner-api", dlock.Options{TTL: time.Minute, Wait: 30 * time.Second, Permits: 4})
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
}

// Lead an election, publish where to reach the leader, and resign.
func ExampleCampaign() {
	ctx := context.Background()
	term, err := dlock.Campaign(ctx, db, "scheduler", "10.0.0.7:8080", dlock.Options{TTL: 15 * time.Second, Wait: dlock.Forever})
	if err != nil {
		log.Fatal(err)
	}
	defer term.Release(ctx) // resign
	log.Printf("leading with epoch %d", term.Fence())
	if err := term.Proclaim(ctx, "10.0.0.7:9090"); err != nil {
		log.Print(err)
	}
	<-term.Context().Done() // lead until deposed (or resigned)
}

// Follow who leads.
func ExampleObserve() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for s := range dlock.Observe(ctx, db, "scheduler") {
		if s.Held() {
			log.Printf("leader %q, epoch %d", s.Value, s.Fence)
		} else {
			log.Printf("nobody leads (%s)", s.State)
		}
	}
}

func ExampleLeader() {
	li, err := dlock.Leader(context.Background(), db, "scheduler")
	if errors.Is(err, dlock.ErrNoLeader) {
		log.Print("nobody leads")
	} else if err == nil {
		log.Printf("%s leads since %v (epoch %d)", li.Value, li.Since, li.Epoch)
	}
}
