module github.com/ringfence/ringfence

go 1.26

replace github.com/ringfence/ringfence/gen/go => ./gen/go

require go.etcd.io/bbolt v1.5.0

require (
	github.com/stretchr/testify v1.12.1 // indirect
	golang.org/x/sys v0.45.0 // indirect
)
