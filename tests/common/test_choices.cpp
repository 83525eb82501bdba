#include <gtest/gtest.h>

#include "common/Choices.h"
#include "common/TrainConfig.h"

using bs::ConfigError;

namespace {

// Every spelling parses to a distinct enum that names itself back, and the config accepts exactly these.
template <class E>
void check_choice(const std::string& key) {
  const auto& values = bs::choice_values(key);
  ASSERT_FALSE(values.empty()) << key;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const E e = bs::parse_choice<E>(values[i]);
    EXPECT_EQ(static_cast<std::size_t>(e), i) << key << " " << values[i];
    EXPECT_EQ(std::string(bs::choice_name(e)), values[i]);
    bs::TrainConfig c;
    c.set(key, values[i], "test");
    if (key == "device" && values[i] == "cuda") continue;  // validate() does not look for a GPU
    EXPECT_NO_THROW(c.validate("test")) << key << "=" << values[i];
  }
  try {
    bs::parse_choice<E>("no-such-value");
    ADD_FAILURE() << key << " accepted an unknown value";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(values.front()), std::string::npos) << e.what();
  }
  bs::TrainConfig c;
  c.set(key, "no-such-value", "test");
  EXPECT_THROW(c.validate("test"), ConfigError) << key;
}

}  // namespace

TEST(Choices, EveryChoiceKeyParsesOnceAndMatchesTheConfigsValidation) {
  check_choice<bs::OptimizerKind>("optimizer.name");
  check_choice<bs::ScheduleKind>("schedule.name");
  check_choice<bs::SamplerKind>("data.sampler");
  check_choice<bs::ClipMode>("clip.mode");
  check_choice<bs::BackendKind>("distributed.backend");
  check_choice<bs::GradDtype>("distributed.grad_dtype");
  check_choice<bs::DeviceKind>("device");
  check_choice<bs::PrecisionKind>("precision");
  EXPECT_TRUE(bs::choice_values("model.hidden").empty());
}

TEST(Choices, LambFamilyIsTheTrustRatioOptimizers) {
  std::vector<std::string> family;
  for (const auto& name : bs::choice_values("optimizer.name"))
    if (bs::is_lamb_family(bs::parse_choice<bs::OptimizerKind>(name))) family.push_back(name);
  EXPECT_EQ(family, (std::vector<std::string>{"lamb", "nvlamb", "lans"}));
}
