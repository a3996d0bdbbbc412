-- Argo CD health of a serving.kubeinfer.dev/InferenceService, from the status the operator writes
-- (Lua 5.1, as Argo CD runs it). Healthy: serving, nothing under way. Progressing: the operator has not
-- seen the latest spec yet, or a rollout, scaling or model load is under way. Suspended: a canary rollout
-- paused (spec.rollout.paused, or a step without a pause waiting for the promote annotation), or the
-- service parked at spec.replicas 0. Degraded: replicas that cannot schedule or start, a rolled-back
-- canary, an invalid spec (the Stalled / Degraded conditions).
local hs = {}

local function condition(type)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == type then
      return c
    end
  end
  return nil
end

local function is_true(c)
  return c ~= nil and c.status == "True"
end

local function said(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

if obj.status == nil or obj.status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the kubeinfer operator to pick the service up"
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the kubeinfer operator to act on generation " .. obj.metadata.generation
  return hs
end

local stalled = condition("Stalled")
local degraded = condition("Degraded")
if is_true(stalled) or is_true(degraded) then
  local c = stalled
  if not is_true(stalled) then
    c = degraded
  end
  hs.status = "Degraded"
  hs.message = (c.reason or "Degraded") .. ": " .. said(c, "")
  return hs
end

local progressing = condition("Progressing")
if is_true(progressing) and (progressing.reason == "Paused" or progressing.reason == "WaitingForPromote") then
  hs.status = "Suspended"
  hs.message = said(progressing, "Rollout paused")
  return hs
end

local ready = condition("Ready")
if ready ~= nil and ready.status == "False" and ready.reason == "ScaledToZero" then
  hs.status = "Suspended"
  hs.message = said(ready, "Scaled to zero by spec.replicas")
  return hs
end

local reconciling = condition("Reconciling")
if is_true(reconciling) or is_true(progressing) then
  hs.status = "Progressing"
  hs.message = said(reconciling, said(progressing, "Rolling out"))
  return hs
end

if is_true(ready) then
  hs.status = "Healthy"
  hs.message = said(ready, "Serving")
  return hs
end

hs.status = "Progressing"
hs.message = said(ready, "Waiting for replicas to become ready")
return hs
