/** @file onnx_writer.cpp
 *  @brief A PolicyModel as ONNX through libonnx's protobuf classes (onnx-ml.pb.h).
 */
#include "export/onnx_writer.hpp"

#include <cstring>
#include <stdexcept>

#include "dqn_config.h"
#include "export/policy_model.hpp"

#if DQN_HAVE_ONNX
#include <onnx/onnx_pb.h>
#endif

namespace dqn {

#if DQN_HAVE_ONNX

bool onnx_available() { return true; }

namespace {

void set_dims(onnx::ValueInfoProto* v, onnx::TensorProto_DataType type, std::initializer_list<std::int64_t> dims) {
  onnx::TypeProto_Tensor* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(type);
  bool first = true;
  for (std::int64_t d : dims) {
    onnx::TensorShapeProto_Dimension* dim = t->mutable_shape()->add_dim();
    if (first)
      dim->set_dim_param("rows");  // any number of observations
    else
      dim->set_dim_value(d);
    first = false;
  }
}

}  // namespace

std::string onnx_bytes(const PolicyModel& m, const std::string& doc) {
  onnx::ModelProto model;
  model.set_ir_version(8);  // ONNX 1.10 and later read it; opset 17 needs IR 8
  model.set_producer_name("dqn-engine");
  model.set_doc_string(doc);
  onnx::OperatorSetIdProto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(17);
  onnx::GraphProto* g = model.mutable_graph();
  g->set_name("policy");
  set_dims(g->add_input(), onnx::TensorProto_DataType_FLOAT, {0, m.obs_size});
  g->mutable_input(0)->set_name(m.input);
  onnx::ValueInfoProto* q = g->add_output();
  q->set_name(m.q);
  set_dims(q, onnx::TensorProto_DataType_FLOAT, {0, m.branches, m.actions});
  onnx::ValueInfoProto* a = g->add_output();
  a->set_name(m.greedy);
  set_dims(a, onnx::TensorProto_DataType_INT64, {0, m.branches});
  for (const PolicyModel::Tensor& t : m.tensors) {
    onnx::TensorProto* p = g->add_initializer();
    p->set_name(t.name);
    for (std::int64_t d : t.shape) p->add_dims(d);
    if (t.is_i64) {
      p->set_data_type(onnx::TensorProto_DataType_INT64);
      p->set_raw_data(std::string(reinterpret_cast<const char*>(t.i64.data()), t.i64.size() * sizeof(std::int64_t)));
    } else {
      p->set_data_type(onnx::TensorProto_DataType_FLOAT);
      p->set_raw_data(std::string(reinterpret_cast<const char*>(t.f32.data()), t.f32.size() * sizeof(float)));
    }
  }
  for (const PolicyModel::Node& n : m.nodes) {
    onnx::NodeProto* p = g->add_node();
    p->set_op_type(n.op);
    p->set_name(n.output);
    for (const std::string& in : n.inputs) p->add_input(in);
    p->add_output(n.output);
    for (const PolicyModel::Attr& at : n.attrs) {
      onnx::AttributeProto* a2 = p->add_attribute();
      a2->set_name(at.name);
      if (at.kind == GraphAttr::integer) {
        a2->set_type(onnx::AttributeProto_AttributeType_INT);
        a2->set_i(at.i);
      } else if (at.kind == GraphAttr::number) {
        a2->set_type(onnx::AttributeProto_AttributeType_FLOAT);
        a2->set_f(float(at.f));
      } else {
        a2->set_type(onnx::AttributeProto_AttributeType_INTS);
        for (std::int64_t v : at.ints) a2->add_ints(v);
      }
    }
  }
  std::string bytes;
  if (!model.SerializeToString(&bytes)) throw std::runtime_error("the ONNX model could not be serialised");
  return bytes;
}

#else

bool onnx_available() { return false; }

std::string onnx_bytes(const PolicyModel&, const std::string&) {
  throw std::runtime_error("this build writes no ONNX: it was configured without libonnx-dev (tools/setup.sh "
                           "installs it; then reconfigure)");
}

#endif

}  // namespace dqn
