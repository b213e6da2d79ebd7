module github.com/ringfence/ringfence

go 1.26

replace github.com/ringfence/ringfence/gen/go => ./gen/go
