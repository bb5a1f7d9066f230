-- Argo CD health of an rljob.dev/RLTrainingJob, from the status the rljob operator writes
-- (phase, observedGeneration and kstatus conditions Ready/Stalled/Failed/Suspended):
--   Progressing  not yet observed, spec edit not yet acted on, Pending, Starting
--   Healthy      Running with all workers ready, or Succeeded
--   Suspended    spec.runPolicy.suspend is true
--   Degraded     Failed (permanent error, deadline, invalid spec) or Stalled
local hs = { status = "Progressing", message = "Waiting for the rljob operator to reconcile the job" }
if obj.status == nil then
  return hs
end
local st = obj.status

local generation = obj.metadata.generation
if generation ~= nil and (st.observedGeneration == nil or st.observedGeneration < generation) then
  hs.message = "Waiting for the rljob operator to act on generation " .. generation
  return hs
end

local conditions = {}
if st.conditions ~= nil then
  for _, condition in ipairs(st.conditions) do
    conditions[condition.type] = condition
  end
end
local function is_true(kind)
  return conditions[kind] ~= nil and conditions[kind].status == "True"
end
local function describe(default)
  local text = default
  if st.reason ~= nil and st.reason ~= "" then
    text = st.reason
  end
  if st.message ~= nil and st.message ~= "" then
    text = text .. ": " .. st.message
  end
  return text
end

local phase = st.phase
if phase == "Failed" or is_true("Failed") or is_true("Stalled") then
  hs.status = "Degraded"
  hs.message = describe("Failed")
  return hs
end
if phase == "Succeeded" or is_true("Succeeded") then
  hs.status = "Healthy"
  hs.message = describe("Succeeded")
  return hs
end
if phase == "Suspended" or is_true("Suspended") then
  hs.status = "Suspended"
  hs.message = describe("Suspended")
  return hs
end
if phase == "Running" and is_true("Ready") then
  hs.status = "Healthy"
  local text = "Running"
  if st.workers ~= nil and st.workers.summary ~= nil and st.workers.summary ~= "" then
    text = text .. " (" .. st.workers.summary .. " workers)"
  end
  if st.progress ~= nil and st.progress.step ~= nil then
    text = text .. ", step " .. st.progress.step
  end
  hs.message = text
  return hs
end
if phase ~= nil and phase ~= "" then
  hs.message = describe(phase)
end
return hs
