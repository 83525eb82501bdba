// model.init_checkpoint: a state dict written by Python PyTorch with Hugging Face / NVIDIA BERT names gives
// the same MLM and NSP logits in bertsweep as in the Python reference model (tests/trainer/
// init_checkpoint_reference.py); a missing or wrongly shaped parameter is a DataError naming the file and
// the first such parameter.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "TestUtil.h"
#include "trainer/BertModel.h"
#include "trainer/InitCheckpoint.h"
#include "dataset/ShardIO.h"

namespace {

constexpr int64_t kVocab = 100, kHidden = 32, kLayers = 2, kHeads = 4, kInter = 64, kMaxPos = 64;

bs::ModelConfig model_config() {
  bs::ModelConfig m;
  m.vocab_size = kVocab;
  m.hidden = kHidden;
  m.layers = kLayers;
  m.heads = kHeads;
  m.intermediate = kInter;
  m.max_position = kMaxPos;
  m.dropout = 0.1;  // eval mode turns it off
  return m;
}

// Runs the Python reference once per test binary: its folder.
const std::string& reference_dir() {
  static const std::string dir = [] {
    std::string d = bs::test::make_temp_dir("initckpt");
    auto r = bs::test::run({"/usr/bin/python3", bs::test::source_dir() + "/tests/trainer/init_checkpoint_reference.py",
                            d, std::to_string(kVocab), std::to_string(kHidden), std::to_string(kLayers),
                            std::to_string(kHeads), std::to_string(kInter), std::to_string(kMaxPos)},
                           300);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return d;
  }();
  return dir;
}

c10::Dict<c10::IValue, c10::IValue> load_dict(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  return torch::pickle_load(bytes).toGenericDict();
}

torch::Tensor get(const c10::Dict<c10::IValue, c10::IValue>& d, const std::string& k) {
  return d.at(c10::IValue(k)).toTensor();
}

std::string error_of(const std::string& file, const bs::ModelConfig& cfg) {
  bs::BertForPretraining model(cfg);
  try {
    bs::load_init_checkpoint(file, model);
  } catch (const bs::DataError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(InitCheckpoint, PythonStateDictGivesTheReferenceLogits) {
  const std::string dir = reference_dir();
  ASSERT_TRUE(std::filesystem::exists(dir + "/state_dict.pt"));
  torch::manual_seed(99);  // random init differs from the file: only loading makes the logits match
  bs::BertForPretraining model(model_config());
  bs::load_init_checkpoint(dir + "/state_dict.pt", model);
  model->eval();
  auto ref = load_dict(dir + "/reference.pt");
  bs::BertInputs in;
  in.input_ids = get(ref, "input_ids");
  in.segment_ids = get(ref, "segment_ids");
  in.position_ids = get(ref, "position_ids");
  in.attention_ids = get(ref, "attention_ids");
  in.mlm_positions = get(ref, "mlm_positions");
  in.nsp_positions = get(ref, "nsp_positions");
  torch::NoGradGuard no_grad;
  auto out = model->forward(in);
  auto want_mlm = get(ref, "mlm_logits"), want_nsp = get(ref, "nsp_logits");
  ASSERT_EQ(out.mlm_logits.sizes(), want_mlm.sizes());
  ASSERT_EQ(out.nsp_logits.sizes(), want_nsp.sizes());
  const double mlm_err = (out.mlm_logits - want_mlm).abs().max().item<double>();
  const double nsp_err = (out.nsp_logits - want_nsp).abs().max().item<double>();
  const double mlm_scale = want_mlm.abs().max().item<double>(), nsp_scale = want_nsp.abs().max().item<double>();
  EXPECT_LE(mlm_err, 1e-5 * mlm_scale + 1e-6) << "MLM logits differ by " << mlm_err << " (scale " << mlm_scale << ")";
  EXPECT_LE(nsp_err, 1e-5 * nsp_scale + 1e-6) << "NSP logits differ by " << nsp_err << " (scale " << nsp_scale << ")";
  EXPECT_GT(mlm_scale, 0.1);  // not trivially zero

  // A model that was not loaded differs: the comparison can fail.
  bs::BertForPretraining fresh(model_config());
  fresh->eval();
  EXPECT_GT((fresh->forward(in).mlm_logits - want_mlm).abs().max().item<double>(), 1e-2);
}

TEST(InitCheckpoint, MissingParameterIsNamed) {
  const std::string file = reference_dir() + "/missing.pt";
  const std::string msg = error_of(file, model_config());
  EXPECT_NE(msg.find(file), std::string::npos) << msg;
  EXPECT_NE(msg.find("encoder.1.ffn.output.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bert.encoder.layer.1.output.dense.weight"), std::string::npos) << msg;
}

TEST(InitCheckpoint, WrongShapeIsNamedWithBothShapes) {
  const std::string file = reference_dir() + "/bad_shape.pt";
  std::string msg = error_of(file, model_config());
  EXPECT_NE(msg.find(file), std::string::npos) << msg;
  EXPECT_NE(msg.find("nsp.classifier.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3, 32]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 32]"), std::string::npos) << msg;
  // The first parameter in the model's order is reported: a model of another vocab fails on the embedding.
  auto other = model_config();
  other.vocab_size = 120;
  msg = error_of(reference_dir() + "/state_dict.pt", other);
  EXPECT_NE(msg.find("embeddings.word_embeddings.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[100, 32]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[120, 32]"), std::string::npos) << msg;
}

TEST(InitCheckpoint, NotACheckpointIsADataError) {
  const std::string dir = bs::test::make_temp_dir("initckpt-bad");
  std::ofstream(dir + "/junk.pt") << "not a checkpoint";
  std::string msg = error_of(dir + "/junk.pt", model_config());
  EXPECT_NE(msg.find("junk.pt"), std::string::npos) << msg;
  msg = error_of(dir + "/nowhere.pt", model_config());
  EXPECT_NE(msg.find("nowhere.pt"), std::string::npos) << msg;
}
