module github.com/ringfence/ringfence/gen/go

go 1.26
