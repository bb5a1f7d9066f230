module rljob.dev/luahealth

go 1.23

require github.com/yuin/gopher-lua v1.1.1
