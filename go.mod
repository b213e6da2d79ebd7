module github.com/ringfence/ringfence

go 1.26

replace github.com/ringfence/ringfence/gen/go => ./gen/go

require (
	github.com/stretchr/testify v1.12.1
	go.etcd.io/bbolt v1.5.0
	golang.org/x/sys v0.45.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
