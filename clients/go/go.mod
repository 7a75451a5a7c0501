module dlock

go 1.19

// Only the tests use a driver; the library needs database/sql alone.
require github.com/lib/pq v1.10.7
