"""A streamed answer's real usage, charged to its API key when the stream ends.

A whole OpenAI answer carries its ``usage`` in the body (or hetflow's ``x-hetflow-tokens``
header), which HAProxy adds to the key's token counter as the answer's headers pass
(:func:`.access.admit_rules`). A streamed one knows its usage only at its end, after the
headers - so without this module it was charged what it *may* use (prompt + ``max_tokens``).

With keys on, the backends that can stream completions (hetflow's generative models, the
gateway when it serves one, ``engine: vllm`` pools and OpenAI upstreams) carry a small Lua
filter (:data:`LUA`, loaded with the upstream filter):

1. on a keyed request whose JSON body has a top-level ``"stream": true`` on a ``.../completions``
   path it asks the server for the usage event - ``"stream_options": {"include_usage": true}``
   put into the body - unless the client set ``stream_options`` itself (its choice stands); in an
   OpenAI upstream's backend it also renames the body's ``model`` to the upstream's (the upstream
   filter's job, which it takes there: one filter may rewrite a body);
2. on the streamed answer (``text/event-stream``) it reads ``usage.total_tokens`` from the event
   that has no choices, and removes that event again where it was put there for the front door
   only (the client did not ask for it; whole events are held until complete for that);
3. when the answer ends - finished, cut, or its client gone - it charges the key the usage it
   saw, else what the request could use (the server's ``x-hetflow-tokens``, else the body's
   ``max_tokens``), and nothing up front (the frontend's header rule skips a request the filter
   took, :data:`AT_END_VAR`; one answered whole after all is charged its header at its end).
   The charge is one request to an internal HAProxy frontend on a Unix socket (mode 600) in the
   front door's folder, which adds it to the key's counter in the same stick table
   (:func:`charge_frontend`): HAProxy's own counters, so rates, quotas and ``hetflow keys
   usage`` see it like any other.

A key's tokens per minute therefore count a stream once it has ended: streams running at once
can together pass the limit by what they generate (the rate limit bounds how many start).
"""

from __future__ import annotations

import os

CHARGE_SOCKET = "charge.sock"
FILTER = "    filter lua.hetflow_usage"
AT_END_VAR = "txn.usage_at_end"  # set on a request whose stream this filter charges at its end

JSON_LUA = r'''
-- hetflow: a JSON body's top level, for the filters below (stream_usage.py)
function hetflow_string_end(body, i)
  -- the closing quote of the string whose opening quote is at i (nil: none)
  local j, n = i + 1, #body
  while j <= n do
    local d = body:sub(j, j)
    if d == '\\' then j = j + 2 elseif d == '"' then return j else j = j + 1 end
  end
  return nil
end

function hetflow_top_level(body)
  -- a JSON object's top-level keys -> where each one's value starts (nil: not an object)
  if body:match("^%s*{") == nil then return nil end
  local keys, depth, i, n, want_key, key = {}, 0, 1, #body, true, nil
  while i <= n do
    local c = body:sub(i, i)
    if c == '"' then
      local j = hetflow_string_end(body, i)
      if j == nil then return nil end
      if depth == 1 then
        if want_key then key = body:sub(i + 1, j - 1)
        elseif key ~= nil and keys[key] == nil then keys[key] = i end
      end
      i = j + 1
    else
      if depth == 1 and not want_key and key ~= nil and keys[key] == nil
         and not c:match("%s") and c ~= '}' then
        keys[key] = i
      end
      if c == '{' or c == '[' then depth = depth + 1
      elseif c == '}' or c == ']' then depth = depth - 1
      elseif depth == 1 and c == ':' then want_key = false
      elseif depth == 1 and c == ',' then want_key = true; key = nil end
      i = i + 1
    end
  end
  return keys
end
'''

_LUA = r'''
-- hetflow: a streamed answer's usage, charged to its key at its end (stream_usage.py)
local CHARGE = "unix@__SOCKET__"
local pending = {}
core.register_task(function()
  while true do
    local item = table.remove(pending, 1)
    if item == nil then core.msleep(20) else
      local s = core.tcp()
      s:settimeout(2)
      if s:connect(CHARGE) then
        s:send("POST / HTTP/1.1\r\nhost: charge\r\nx-hetflow-key: " .. item[1]
               .. "\r\nx-hetflow-tokens: " .. item[2]
               .. "\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        s:receive("*l")
      end
      s:close()
    end
  end
end)

local function usage_total(text)
  local t = text:match('"usage"%s*:%s*{[^}]-"total_tokens"%s*:%s*(%d+)')
  return t and tonumber(t)
end

HetflowUsage = {}
HetflowUsage.id = "hetflow stream usage"
HetflowUsage.flags = filter.FLT_CFG_FL_HTX
HetflowUsage.__index = HetflowUsage
function HetflowUsage:new() return setmetatable({}, HetflowUsage) end
function HetflowUsage:start_analyze(txn, chn)
  filter.register_data_filter(self, chn)
end
function HetflowUsage:http_headers(txn, msg)
  if not msg.channel:is_resp() then
    -- the request body's edits: an upstream's model name (in an upstream's backend, where
    -- this filter stands for the model rewrite too) and the ask for the stream's usage
    if txn.sf:req_body_len() ~= txn.sf:req_body_size() then return end
    local body = txn.sf:req_body() or ""
    local keys = hetflow_top_level(body)
    if keys == nil then return end
    local edits = {}  -- {position, old length, text}, applied from the end
    local name = txn:get_var("txn.up_model")
    local at = keys["model"]
    if name ~= nil and at ~= nil and body:sub(at, at) == '"' then
      local stop = hetflow_string_end(body, at)
      if stop ~= nil and body:sub(at + 1, stop - 1) ~= name then
        table.insert(edits, {at + 1, stop - at - 1, name})
      end
    end
    self.key = txn:get_var("txn.kname")
    local path = txn.f:hdr("x-hetflow-path") or txn.sf:path() or ""
    if self.key ~= nil and path:match("/completions$") and keys["stream"] ~= nil
       and body:sub(keys["stream"], keys["stream"] + 3) == "true" then
      self.stream = true
      txn:set_var("__AT_END__", 1)
      if keys["stream_options"] == nil then
        local open = body:find("{", 1, true)
        table.insert(edits, 1, {open + 1, 0, '"stream_options":{"include_usage":true},'})
        self.strip = true
      end
    end
    if #edits == 0 then return end
    local out = body
    for i = #edits, 1, -1 do
      local e = edits[i]
      out = out:sub(1, e[1] - 1) .. e[3] .. out:sub(e[1] + e[2])
    end
    self.body, self.old = out, #body
    msg:set_body_len(#out)
    return
  end
  if not self.stream then return end
  -- (HAProxy's http-response rules have run: the header is what they and the server said)
  local h = msg:get_headers()
  local ct = h["content-type"] and h["content-type"][0] or ""
  local said = tonumber(h["x-hetflow-tokens"] and h["x-hetflow-tokens"][0] or "")
  if not ct:lower():match("^text/event%-stream") then
    self.whole = said  -- not streamed after all: the whole answer's tokens, as its header says
    return
  end
  self.events = true
  self.bound = said or tonumber(txn:get_var("txn.max_tokens") or "") or 0
  msg:del_header("x-hetflow-tokens")
  self.tail = ""
end
function HetflowUsage:http_payload(txn, msg)
  if not msg.channel:is_resp() then
    if self.body ~= nil then msg:set(self.body, 0, self.old); self.body = nil end
    return
  end
  if not self.events then return end
  local data = msg:body() or ""
  if not self.strip then
    self.total = usage_total(self.tail .. data) or self.total
    self.tail = data:sub(-400)
    return
  end
  -- whole events only: a part waits for the rest unless the answer ends here
  local upto, p = 0, 1
  while true do
    local a = data:find("\n\n", p, true)
    if a == nil then break end
    upto = a + 1
    p = a + 2
  end
  local last = msg:eom()
  if last then upto = #data end
  local s, removed = 1, 0
  while s <= upto do
    local e = data:find("\n\n", s, true)
    local stop = (e and e + 1 <= upto) and e + 1 or upto
    local event = data:sub(s, stop)
    local total = usage_total(event)
    if total ~= nil and event:find('"choices"%s*:%s*%[%s*%]') then
      self.total = total
      msg:remove(s - 1 - removed, #event)
      removed = removed + #event
    end
    s = stop + 1
  end
  if last then return end
  return upto - removed
end
function HetflowUsage:end_analyze(txn, chn)
  if chn:is_resp() and self.stream and self.key ~= nil then
    local n = self.total or self.whole or self.bound or 0
    if n > 0 then table.insert(pending, {self.key, n}) end
  end
end
core.register_filter("hetflow_usage", HetflowUsage, function(f, args) return f end)
'''


def lua_source(directory: str) -> str:
    """The filter's Lua, charging through the socket in ``directory``."""
    return (_LUA.replace("__SOCKET__", charge_socket(directory))
            .replace("__AT_END__", AT_END_VAR))


def charge_socket(directory: str) -> str:
    return os.path.join(directory, CHARGE_SOCKET)


def charge_frontend(directory: str, tokens_table: str, key_header: str, tokens_header: str) -> list[str]:
    """The internal frontend the filter charges through: the key's name and its tokens in two
    headers, added to the key's counter in ``tokens_table``; reachable only by this HAProxy's
    user (a Unix socket, mode 600)."""
    return [
        "frontend hetflow_charge",
        f"    bind unix@{charge_socket(directory)} mode 600",
        f"    http-request track-sc1 req.hdr({key_header}) table {tokens_table} "
        f"if {{ req.hdr({key_header}) -m found }}",
        f"    http-request sc-add-gpc(0,1) req.hdr({tokens_header}) "
        f"if {{ req.hdr({key_header}) -m found }} {{ req.hdr({tokens_header}) -m int gt 0 }}",
        "    http-request return status 204",
    ]


__all__ = ["AT_END_VAR", "CHARGE_SOCKET", "FILTER", "JSON_LUA", "charge_frontend", "charge_socket",
           "lua_source"]
