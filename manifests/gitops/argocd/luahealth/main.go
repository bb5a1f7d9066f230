// Command luahealth runs an Argo CD resource health script the way Argo CD does: Lua 5.1 on
// gopher-lua, the object as the global `obj`, the returned table read as {status, message}.
//
//	luahealth health.lua < objects.json   # a JSON array of objects in, a JSON array of health out
//
// tests/delivery/test_gitops.py uses it for manifests/gitops/argocd/health/**/health_test.yaml.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	lua "github.com/yuin/gopher-lua"
)

type health struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func toLua(l *lua.LState, v interface{}) lua.LValue {
	switch x := v.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(x)
	case float64:
		return lua.LNumber(x)
	case string:
		return lua.LString(x)
	case []interface{}:
		t := l.NewTable()
		for _, item := range x {
			t.Append(toLua(l, item))
		}
		return t
	case map[string]interface{}:
		t := l.NewTable()
		for k, item := range x {
			t.RawSetString(k, toLua(l, item))
		}
		return t
	}
	panic(fmt.Sprintf("unsupported JSON value %T", v))
}

func evaluate(script string, obj interface{}) (health, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	// The libraries Argo CD opens for health scripts.
	for _, lib := range []struct {
		name string
		fn   lua.LGFunction
	}{{lua.LoadLibName, lua.OpenPackage}, {lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable},
		{lua.StringLibName, lua.OpenString}, {lua.MathLibName, lua.OpenMath}} {
		l.Push(l.NewFunction(lib.fn))
		l.Push(lua.LString(lib.name))
		l.Call(1, 0)
	}
	l.SetGlobal("obj", toLua(l, obj))
	if err := l.DoString(script); err != nil {
		return health{}, err
	}
	table, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		return health{}, fmt.Errorf("the script returned %s, not a table", l.Get(-1).Type())
	}
	return health{
		Status:  lua.LVAsString(table.RawGetString("status")),
		Message: lua.LVAsString(table.RawGetString("message")),
	}, nil
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: luahealth health.lua < objects.json")
		os.Exit(2)
	}
	script, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var objects []interface{}
	if err := json.NewDecoder(os.Stdin).Decode(&objects); err != nil {
		fmt.Fprintln(os.Stderr, "reading objects:", err)
		os.Exit(2)
	}
	out := make([]health, 0, len(objects))
	for i, obj := range objects {
		h, err := evaluate(string(script), obj)
		if err != nil {
			fmt.Fprintf(os.Stderr, "object %d: %v\n", i, err)
			os.Exit(1)
		}
		out = append(out, h)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
