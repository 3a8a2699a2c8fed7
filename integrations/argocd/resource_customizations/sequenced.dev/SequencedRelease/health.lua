-- Health of a sequenced.dev/SequencedRelease: a Helm chart the sequenced operator deploys
-- layer by layer. It reads the status the operator writes: the kstatus conditions Ready,
-- Reconciling and Stalled, status.phase and status.observedGeneration. Only the base and
-- table libraries are used, so it runs as an argocd-cm health check without
-- resource.customizations.useOpenLibs.

local function condition(conditionType)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == conditionType then
      return c
    end
  end
  return nil
end

-- "Reason: message", or whichever of the two is set.
local function told(c)
  if c == nil then
    return ""
  end
  local reason = c.reason or ""
  local message = c.message or ""
  if reason ~= "" and message ~= "" then
    return reason .. ": " .. message
  end
  return reason .. message
end

local hs = {}

-- Being deleted: the operator uninstalls the chart in reverse order.
if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "Uninstalling"
  if obj.status ~= nil and obj.status.message ~= nil and obj.status.message ~= "" then
    hs.message = "Uninstalling: " .. obj.status.message
  end
  return hs
end

if obj.spec ~= nil and obj.spec.suspend == true then
  hs.status = "Suspended"
  hs.message = "Suspended: spec.suspend is true"
  return hs
end

if obj.status == nil or obj.status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the sequenced operator to act on the release"
  return hs
end

-- A status written for an older generation says nothing about this one.
if obj.metadata.generation ~= nil and obj.status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the sequenced operator to act on generation " .. obj.metadata.generation
  return hs
end

local ready = condition("Ready")
local stalled = condition("Stalled")

-- Stalled: it cannot go on until its spec changes (an unusable spec, a failure with its
-- retries spent, a revision spec.onFailure rolled back).
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = told(stalled)
  return hs
end

-- Failed, a retry scheduled (spec.retries).
if obj.status.phase == "Failed" then
  hs.status = "Degraded"
  hs.message = told(ready)
  return hs
end

if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message or ""
  return hs
end

-- A revision, rollback or test run under way, or waiting for its dependsOn.
hs.status = "Progressing"
if obj.status.message ~= nil and obj.status.message ~= "" then
  hs.message = obj.status.message
else
  hs.message = told(ready)
end
if obj.status.phase == "RollingBack" then
  hs.message = "Rolling back: " .. hs.message
end
return hs
