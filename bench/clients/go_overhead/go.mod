module dlockbench

go 1.19

require (
	dlock v0.0.0
	github.com/lib/pq v1.10.7
)

replace dlock => ../../../clients/go
