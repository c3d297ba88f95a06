// The C API's elastic membership section (comm/lbcc.h over comm/elastic/elastic.h); the
// other sections are in comm/ (c_api_internal.h lists them).
#include <cmath>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "comm/c_api_internal.h"
#include "comm/elastic/elastic.h"
#include "comm/lbcc.h"

// ---- Elastic membership (comm/elastic/elastic.h) ----
struct lbccElastic {
  std::unique_ptr<lbcc::comm::ElasticGroup> group;
};

struct lbccElasticMaster {
  std::unique_ptr<lbcc::comm::ElasticMaster> master;
  std::string address;
};

struct lbccElasticUnits {
  std::shared_ptr<lbcc::comm::ElasticUnits> units;
};

namespace {

// Fail, with the one retryable status (membership changed) as lbccMembershipChanged and a
// pipeline stage's "its replica left" as lbccReplicaLeft.
lbccResult_t FailElastic(const absl::Status& status) {
  const lbccResult_t result = Fail(status);
  if (lbcc::comm::IsRetryable(status)) return lbccMembershipChanged;
  if (lbcc::comm::IsReplicaLeft(status)) return lbccReplicaLeft;
  return result;
}

// The sizes of lbccElasticConfig_t's layouts: before pipeline units (it ended at `comm`), now.
constexpr size_t kElasticConfigSizeBeforeUnits = offsetof(lbccElasticConfig_t, replica);

absl::StatusOr<absl::Duration> SecondsField(double value, const char* field,
                                            absl::Duration unset) {
  if (value == LBCC_CONFIG_UNDEF_DOUBLE) return unset;
  if (!(value > 0) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat("lbccElasticConfig_t.", field, "=", value,
                                                   " is invalid: expected a finite number > 0 "
                                                   "(LBCC_CONFIG_UNDEF_DOUBLE: the default)"));
  }
  return absl::Seconds(value);
}

absl::StatusOr<lbcc::comm::ElasticOptions> ElasticOptionsFrom(const lbccElasticConfig_t* config) {
  if ((config->size != sizeof(lbccElasticConfig_t) &&
       config->size != kElasticConfigSizeBeforeUnits) ||
      config->magic != LBCC_CONFIG_MAGIC) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lbccElasticConfig_t.size=", config->size, " or its magic is wrong (this library's size is ",
        sizeof(lbccElasticConfig_t), ", or ", kElasticConfigSizeBeforeUnits,
        " before pipeline units): initialise it with LBCC_ELASTIC_CONFIG_INITIALIZER"));
  }
  if (config->version > LBCC_VERSION_CODE) {
    return absl::InvalidArgumentError(absl::StrCat("lbccElasticConfig_t.version=", config->version,
                                                   " is newer than this library (",
                                                   LBCC_VERSION_CODE, ")"));
  }
  if (config->jobId == nullptr) {
    return absl::InvalidArgumentError("lbccElasticConfig_t.jobId is NULL");
  }
  lbcc::comm::ElasticOptions options;
  if (config->masterAddr != nullptr) options.master_address = config->masterAddr;
  options.job_id = config->jobId;
  if (config->name != nullptr) options.name = config->name;
  LBCC_ASSIGN_OR_RETURN(options.op_timeout,
                        SecondsField(config->opTimeoutSeconds, "opTimeoutSeconds",
                                     options.op_timeout));
  LBCC_ASSIGN_OR_RETURN(options.join_timeout,
                        SecondsField(config->joinTimeoutSeconds, "joinTimeoutSeconds",
                                     options.join_timeout));
  LBCC_ASSIGN_OR_RETURN(options.peer_timeout,
                        SecondsField(config->peerTimeoutSeconds, "peerTimeoutSeconds",
                                     options.peer_timeout));
  if (config->stateStep < -1) {
    return absl::InvalidArgumentError(absl::StrCat("lbccElasticConfig_t.stateStep=",
                                                   config->stateStep, " is invalid: >= -1"));
  }
  options.state_step = config->stateStep;
  if (config->comm != nullptr) {
    LBCC_ASSIGN_OR_RETURN(options.comm_config, ConfigFrom(config->comm));
  }
  if (config->size < sizeof(lbccElasticConfig_t)) return options;  // a full replica
  // A pipeline stage: checked here, naming the fields, before anything connects.
  if (config->replica == nullptr) {
    if (config->replicaStages != 0 || config->stage != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lbccElasticConfig_t.replicaStages=", config->replicaStages, ", stage=", config->stage,
          " without a replica: set lbccElasticConfig_t.replica (a pipeline stage) or leave both "
          "0 (a full replica)"));
    }
    return options;
  }
  if (config->replica[0] == '\0') {
    return absl::InvalidArgumentError(
        "lbccElasticConfig_t.replica is empty: a pipeline replica's name, or NULL for a full "
        "replica");
  }
  if (config->replicaStages < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lbccElasticConfig_t.replicaStages=", config->replicaStages, " is invalid for replica '",
        config->replica, "': expected the pipeline replica's number of stages, >= 1"));
  }
  if (config->stage < 0 || config->stage >= config->replicaStages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lbccElasticConfig_t.stage=", config->stage, " is invalid for replica '",
        config->replica, "' of ", config->replicaStages, " stages: expected 0 <= stage < ",
        config->replicaStages));
  }
  options.replica = config->replica;
  options.stage = config->stage;
  options.replica_stages = config->replicaStages;
  return options;
}

absl::StatusOr<lbcc::comm::ElasticMasterOptions> MasterOptionsFrom(
    const lbccElasticMasterConfig_t* config) {
  if (config->size != sizeof(lbccElasticMasterConfig_t) || config->magic != LBCC_CONFIG_MAGIC) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lbccElasticMasterConfig_t.size=", config->size,
        " or its magic is wrong (this library's size is ", sizeof(lbccElasticMasterConfig_t),
        "): initialise it with LBCC_ELASTIC_MASTER_CONFIG_INITIALIZER"));
  }
  if (config->version > LBCC_VERSION_CODE) {
    return absl::InvalidArgumentError(absl::StrCat("lbccElasticMasterConfig_t.version=",
                                                   config->version, " is newer than this library (",
                                                   LBCC_VERSION_CODE, ")"));
  }
  if (config->jobId == nullptr || config->jobId[0] == '\0') {
    return absl::InvalidArgumentError("lbccElasticMasterConfig_t.jobId is NULL or empty");
  }
  if (config->minMembers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("lbccElasticMasterConfig_t.minMembers=",
                                                   config->minMembers, " is invalid: >= 1"));
  }
  lbcc::comm::ElasticMasterOptions options;
  if (config->listenAddr != nullptr) options.listen_address = config->listenAddr;
  options.job_id = config->jobId;
  options.min_members = config->minMembers;
  if (config->bootstrapHost != nullptr) options.bootstrap_host = config->bootstrapHost;
  const auto seconds = [](double value, const char* field) -> absl::StatusOr<absl::Duration> {
    if (value == LBCC_CONFIG_UNDEF_DOUBLE) return absl::ZeroDuration();
    if (!(value > 0) || !std::isfinite(value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lbccElasticMasterConfig_t.", field, "=", value,
          " is invalid: expected a finite number > 0 (LBCC_CONFIG_UNDEF_DOUBLE: the default)"));
    }
    return absl::Seconds(value);
  };
  LBCC_ASSIGN_OR_RETURN(options.peer_timeout,
                        seconds(config->peerTimeoutSeconds, "peerTimeoutSeconds"));
  LBCC_ASSIGN_OR_RETURN(options.setup_timeout,
                        seconds(config->setupTimeoutSeconds, "setupTimeoutSeconds"));
  if (config->units != nullptr) options.units = config->units->units;
  return options;
}

lbccResult_t StartMaster(lbccElasticMaster_t* master, lbcc::comm::ElasticMasterOptions options,
                         const char* function) {
  absl::StatusOr<std::unique_ptr<lbcc::comm::ElasticMaster>> started =
      lbcc::comm::ElasticMaster::Start(std::move(options));
  if (!started.ok()) return Fail(lbcc::Annotate(started.status(), function));
  *master = new lbccElasticMaster{std::move(*started), ""};
  (*master)->address = (*master)->master->address();
  return lbccSuccess;
}

}  // namespace

extern "C" {

lbccResult_t lbccElasticJoin(lbccElastic_t* group, const lbccElasticConfig_t* config, int nstate,
                             void* const* state, const size_t* state_bytes) {
  const char* kName = "lbccElasticJoin";
  LBCC_C_CHECK_PTR(kName, group);
  LBCC_C_CHECK_PTR(kName, config);
  if (nstate < 0) return Fail(absl::InvalidArgumentError("lbccElasticJoin: nstate < 0"));
  if (nstate > 0) {
    LBCC_C_CHECK_PTR(kName, state);
    LBCC_C_CHECK_PTR(kName, state_bytes);
  }
  absl::StatusOr<lbcc::comm::ElasticOptions> options = ElasticOptionsFrom(config);
  if (!options.ok()) return Fail(lbcc::Annotate(options.status(), kName));
  std::vector<lbcc::TensorView> views;
  for (int i = 0; i < nstate; ++i) {
    if (state[i] == nullptr && state_bytes[i] > 0) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("lbccElasticJoin: state buffer ", i, " is NULL")));
    }
    absl::StatusOr<lbcc::TensorView> view = lbcc::TensorView::Create(
        state[i], lbcc::DType::kU8, {static_cast<int64_t>(state_bytes[i])});
    if (!view.ok()) return Fail(lbcc::Annotate(view.status(), kName));
    views.push_back(*view);
  }
  absl::StatusOr<std::unique_ptr<lbcc::comm::ElasticGroup>> joined =
      lbcc::comm::ElasticGroup::Join(*std::move(options), std::move(views));
  if (!joined.ok()) return FailElastic(joined.status());
  *group = new lbccElastic{std::move(*joined)};
  return lbccSuccess;
}

lbccResult_t lbccElasticBoundary(lbccElastic_t group) {
  LBCC_C_CHECK_PTR("lbccElasticBoundary", group);
  return FailElastic(group->group->Boundary());
}

lbccResult_t lbccElasticSparseAllReduce(int ntensors, const float* const* deltas,
                                        float* const* outs, const int* ranks,
                                        const int64_t* const* dims, lbccTopKState_t* states,
                                        const lbccTopKConfig_t* config,
                                        lbccAggregation_t aggregation, lbccElastic_t group) {
  const char* kName = "lbccElasticSparseAllReduce";
  LBCC_C_CHECK_PTR(kName, group);
  absl::StatusOr<SparseCall> call =
      ParseSparseCall(kName, ntensors, deltas, outs, ranks, dims, states, config, aggregation);
  if (!call.ok()) return Fail(lbcc::Annotate(call.status(), kName));
  return FailElastic(
      group->group->SparseAllReduce(call->tensors, call->codec.get(), call->decode));
}

lbccResult_t lbccElasticLeave(lbccElastic_t group) {
  LBCC_C_CHECK_PTR("lbccElasticLeave", group);
  return FailElastic(group->group->Leave());
}

lbccResult_t lbccElasticQuery(const lbccElastic_t group, uint64_t* epoch, int* rank, int* size,
                              uint64_t* step) {
  LBCC_C_CHECK_PTR("lbccElasticQuery", group);
  if (epoch != nullptr) *epoch = group->group->epoch();
  if (rank != nullptr) *rank = group->group->rank();
  if (size != nullptr) *size = group->group->size();
  if (step != nullptr) *step = group->group->step();
  return lbccSuccess;
}

lbccResult_t lbccElasticDestroy(lbccElastic_t group) {
  LBCC_C_CHECK_PTR("lbccElasticDestroy", group);
  delete group;
  return lbccSuccess;
}

lbccResult_t lbccElasticMasterCreate(lbccElasticMaster_t* master, const char* listen_addr,
                                     const char* job_id, int min_members,
                                     double peer_timeout_seconds) {
  LBCC_C_CHECK_PTR("lbccElasticMasterCreate", master);
  LBCC_C_CHECK_PTR("lbccElasticMasterCreate", job_id);
  lbcc::comm::ElasticMasterOptions options;
  if (listen_addr != nullptr) options.listen_address = listen_addr;
  options.job_id = job_id;
  options.min_members = min_members;
  if (!std::isfinite(peer_timeout_seconds)) {
    return Fail(absl::InvalidArgumentError("lbccElasticMasterCreate: peerTimeoutSeconds is not finite"));
  }
  if (peer_timeout_seconds > 0) options.peer_timeout = absl::Seconds(peer_timeout_seconds);
  return StartMaster(master, std::move(options), "lbccElasticMasterCreate");
}

lbccResult_t lbccElasticMasterCreateConfig(lbccElasticMaster_t* master,
                                           const lbccElasticMasterConfig_t* config) {
  const char* kName = "lbccElasticMasterCreateConfig";
  LBCC_C_CHECK_PTR(kName, master);
  LBCC_C_CHECK_PTR(kName, config);
  absl::StatusOr<lbcc::comm::ElasticMasterOptions> options = MasterOptionsFrom(config);
  if (!options.ok()) return Fail(lbcc::Annotate(options.status(), kName));
  return StartMaster(master, *std::move(options), kName);
}

lbccResult_t lbccElasticUnitsCreate(lbccElasticUnits_t* units) {
  LBCC_C_CHECK_PTR("lbccElasticUnitsCreate", units);
  *units = new lbccElasticUnits{lbcc::comm::NewElasticUnits()};
  return lbccSuccess;
}

lbccResult_t lbccElasticUnitsDestroy(lbccElasticUnits_t units) {
  LBCC_C_CHECK_PTR("lbccElasticUnitsDestroy", units);
  delete units;  // the masters hold their own references
  return lbccSuccess;
}

const char* lbccElasticMasterAddress(const lbccElasticMaster_t master) {
  return master == nullptr ? "" : master->address.c_str();
}

lbccResult_t lbccElasticMasterQuery(const lbccElasticMaster_t master, uint64_t* epoch,
                                    int* members, uint64_t* committed_steps) {
  LBCC_C_CHECK_PTR("lbccElasticMasterQuery", master);
  if (epoch != nullptr) *epoch = master->master->epoch();
  if (members != nullptr) *members = master->master->members();
  if (committed_steps != nullptr) *committed_steps = master->master->committed_steps();
  return lbccSuccess;
}

lbccResult_t lbccElasticMasterDestroy(lbccElasticMaster_t master) {
  LBCC_C_CHECK_PTR("lbccElasticMasterDestroy", master);
  master->master->Stop();
  delete master;
  return lbccSuccess;
}

}  // extern "C"
// ---- end of Elastic membership ----
